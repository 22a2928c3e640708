"""Fleets (`kind: fleet`): one public endpoint over several deployments, through gateway replicas that share
one circuit breaker, lease-based admission and API keys in their own etcd (the package `gateway` runs on the
hosts)."""
