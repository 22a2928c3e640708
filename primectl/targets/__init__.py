"""Deployment targets: the Target protocol (base.py) and its implementations, SSH/local hosts (ssh.py),
Slurm (slurm.py, slurm_*.py) and Kubernetes (kubernetes.py, k8s_*.py), registered in primectl/registry.py."""
