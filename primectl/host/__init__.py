"""The host side of primectl: what runs on a host, with that host's python3, and nothing of primectl installed.

Every module here imports only the standard library, the others here, and primectl.plan.layout; the controller
ships them to a host as one bundle (deploy/shipping.py), and imports them as ordinary modules itself.

- `wire`: the request and result types of the agent's operations and the state.json schema;
- `json_codec`: JSON through the json module's C accelerator, without importing json;
- `files`: writing, copying and removing files and trees, and unpacking a release;
- `processes`: process sessions: start one, find its members, stop them;
- `probes`: readiness probes (http, tcp, command), and when to retry them;
- `haproxy`: operations on a load balancer's admin socket (drain, back into rotation, reload);
- `supervisor`: what a supervisor does (the base class), and draining a service by signal;
- `process_supervisor`, `systemd_supervisor`: the two supervisors;
- `logs`: reading service logs (their last line, their tail, terminal escapes removed);
- `agent`: the host agent's operations, its dispatcher and its entry point;
- `slurm_wait`: inside a Slurm job, waiting for services to pass their probes (bin/primectl-wait).
"""
