"""Post-deployment checks: endpoint smoke tests (`primectl smoke`) and the pure logic they use."""
