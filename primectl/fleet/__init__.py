"""Fleets (`kind: fleet`): one public endpoint over several deployments, through gateway replicas that share
one circuit breaker, lease-based admission and API keys in their own etcd (replica.py runs on the hosts)."""
