"""`target: nomad` for primectl: the plan as one HashiCorp Nomad job, render only.

`primectl render RECIPE --target nomad -o DIR` writes DIR/<name>.nomad.json,
a job in the JSON form `nomad job run -json` reads (the API's job spec):

- one task group per host the plan uses, pinned to the Nomad node of that
  name (constraint on `${node.unique.name}`), with the host's ports reserved
  as static ports;
- one `raw_exec` task per service: its argv (command + args) and env exactly
  as planned, its files and the generated model as templates under the task's
  own directory (the plan's release directory becomes `${NOMAD_TASK_DIR}`),
  its stop timeout, and its readiness probe as a Nomad service check.

What Nomad has no place for is recorded in each task's Meta: the start order
(`primectl.depends_on`: Nomad starts a group's tasks together, and Dynamo's
processes wait for discovery themselves) and the drain. This is a render-only
target: it implements primectl's RenderTarget part and nothing else, so
`primectl up` refuses it and points at `primectl render`; deploying is
`nomad job run -json DIR/<name>.nomad.json`.

It is installed as a distribution of its own and found through its entry
point (group `primectl.targets`); nothing in primectl names it.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from primectl.plan.model import RELEASE, HostPlan, Plan, Service
from primectl.recipe.model import Recipe
from primectl.render.bundle import MODEL_ROLES, model_files
from primectl.targets.base import PlannedHosts

SECOND_NS = 1_000_000_000  # Nomad's JSON durations are nanoseconds
TASK_DIR = "${NOMAD_TASK_DIR}"
# Template delimiters no rendered file contains, so file contents are copied verbatim.
LEFT, RIGHT = "[[primectl:", ":primectl]]"


def _label(service: str, port: str) -> str:
    return f"{service}_{port}".replace("-", "_")


def _local(value: str) -> str:
    return value.replace(RELEASE, TASK_DIR)


def _template(path: str, content: bytes, mode: int = 0o644) -> dict[str, Any]:
    try:
        text = content.decode()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not text; a Nomad template carries text only") from None
    return {"DestPath": f"local/{path}", "EmbeddedTmpl": text, "LeftDelim": LEFT, "RightDelim": RIGHT,
            "Perms": f"{mode:o}", "ChangeMode": "restart"}


def _check(svc: Service) -> list[dict[str, Any]]:
    probe = svc.ready
    if probe.kind == "http" and probe.url:
        url = urlsplit(_local(probe.url))
        labels = [name for name, port in svc.ports.items() if port == url.port]
        if labels:
            return [{"Name": f"{svc.name}-ready", "Type": "http", "Path": url.path or "/",
                     "PortLabel": _label(svc.name, labels[0]), "Interval": 5 * SECOND_NS, "Timeout": 2 * SECOND_NS}]
    if probe.kind == "tcp" and probe.port is not None:
        labels = [name for name, port in svc.ports.items() if port == probe.port]
        if labels:
            return [{"Name": f"{svc.name}-ready", "Type": "tcp", "PortLabel": _label(svc.name, labels[0]),
                     "Interval": 5 * SECOND_NS, "Timeout": 2 * SECOND_NS}]
    return []


def _task(plan: Plan, svc: Service, model: dict[str, bytes]) -> dict[str, Any]:
    templates = [_template(f.path, f.content.encode(), f.mode) for f in svc.files]
    if svc.role in MODEL_ROLES:
        templates += [_template(path, data) for path, data in sorted(model.items())]
    task: dict[str, Any] = {
        "Name": svc.name,
        "Driver": "raw_exec",
        "Config": {"command": _local(svc.argv[0]), "args": [_local(a) for a in svc.argv[1:]]},
        "Env": {k: _local(v) for k, v in sorted(svc.env.items())},
        "KillTimeout": svc.stop_timeout_s * SECOND_NS,
        "Meta": {"primectl.role": svc.role, "primectl.component": svc.component,
                 "primectl.depends_on": ",".join(svc.depends_on),
                 "primectl.drain": svc.drain.how if svc.drain else "none"},
    }
    if templates:
        task["Templates"] = templates
    checks = _check(svc)
    if svc.ports:
        task["Services"] = [{"Name": f"{plan.name}-{svc.name}", "Provider": "nomad",
                             "PortLabel": _label(svc.name, sorted(svc.ports)[0]), "Checks": checks}]
    return task


def nomad_job(plan: Plan) -> dict[str, Any]:
    """The plan as a Nomad job (API JSON)."""
    model = model_files(plan)
    groups = []
    for host in plan.hosts:
        services = plan.services_on(host.name)
        if not services:
            continue
        ports = [{"Label": _label(s.name, name), "Value": port} for s in services for name, port in sorted(s.ports.items())]
        groups.append({
            "Name": host.name,
            "Count": 1,
            "Constraints": [{"LTarget": "${node.unique.name}", "Operand": "=", "RTarget": host.name}],
            "Networks": [{"Mode": "host", "ReservedPorts": ports}],
            "Tasks": [_task(plan, s, model) for s in services],
        })
    return {"Job": {
        "ID": plan.name, "Name": plan.name, "Type": "service", "Datacenters": ["*"], "Namespace": "default",
        "Meta": {"primectl.recipe_hash": plan.recipe_hash, "primectl.engine": plan.engine,
                 "primectl.endpoint": plan.endpoint, "primectl.served_model": plan.served_model},
        "TaskGroups": groups,
    }}


class NomadTarget:
    """`target: nomad`: render only (primectl.targets.base.RenderTarget)."""

    name = "nomad"
    surges = False  # Nomad replaces allocations itself: no surge twins beside running workers

    def plan_hosts(self, recipe: Recipe, hosts: list[HostPlan]) -> PlannedHosts:
        """The recipe's hosts, as the Nomad nodes of those names."""
        return PlannedHosts(hosts)

    def bind(self, plan: Plan) -> Plan:
        """Unchanged: each group is pinned to its node by name at render time."""
        return plan

    def render(self, plan: Plan) -> dict[str, bytes]:
        """DIR/<name>.nomad.json."""
        return {f"{plan.name}.nomad.json": (json.dumps(nomad_job(plan), indent=2, sort_keys=True) + "\n").encode()}

    def instead(self, plan: Plan, command: str, service: str | None) -> str:
        """What to run instead of `primectl COMMAND` (quoted by primectl's refusal)."""
        job = f"{plan.name}.nomad.json"
        if command == "status":
            return f"nomad job status {plan.name}"
        if command == "logs" and service:
            return f"nomad alloc logs -job {plan.name} {service}"
        if command == "down":
            return f"nomad job stop {plan.name}"
        if command == "unlock":
            return "nothing: primectl holds no lock on a Nomad cluster"
        return f"nomad job run -json DIR/{job} (nomad job plan -json DIR/{job} shows what would change)"
