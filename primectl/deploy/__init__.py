"""Apply a rendered plan to hosts: transport, host agent, rollout, status."""
