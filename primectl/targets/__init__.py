"""Deployment targets other than SSH hosts: what primectl renders for Kubernetes and, later, Slurm."""
