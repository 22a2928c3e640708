"""Apply a rendered plan to hosts: transports, shipping the host agent (primectl.host) to them, rollout, status."""
