"""Deployment targets: the RenderTarget and Deploys protocols (base.py) and the built-in implementations,
SSH/local hosts (ssh.py), Slurm (slurm.py, slurm_*.py) and Kubernetes (kubernetes.py, k8s_*.py, render only),
registered in primectl/registry.py; plugins add more through entry points (group primectl.targets)."""
