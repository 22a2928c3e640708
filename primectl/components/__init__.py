"""Components: the services primectl runs that are not inference engines (base.py has the protocol).

Each module knows one component's command line, ports and probes at its pinned version: etcd, the Dynamo
frontend, HAProxy in front of the frontends, Mooncake's master. Plugins add more through entry points.
"""
