"""The fleet gateway replica (`replica.py`, one module per job beside it), shipped to gateway hosts as the package
`fleet_gateway` and run there on the host runtime's Python: aiohttp and the standard library only, no primectl.
Its modules import one another relatively, so the same files are `primectl.fleet.gateway` here."""
