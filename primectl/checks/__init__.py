"""Checks against hosts and deployments: preflight probes and the endpoint smoke tests (`primectl smoke`)."""
