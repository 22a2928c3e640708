"""One Plan service as the `main` container of a Dynamo operator pod.

The Plan is written for hosts: argv, env and files carry host addresses,
per-host ports and flags a Kubernetes operator supplies itself. This module
turns one service into a `ContainerDraft` that holds for every pod of its
component:

- dropped: what the operator provides (discovery, the Dynamo namespace, the
  frontend's HTTP address, a multinode worker's per-node data-parallel
  or tensor-parallel launch flags, as the engine's image declares them) and what only made sense on a shared
  host (advertised addresses, per-process ports, CUDA_VISIBLE_DEVICES, and the env the engine's image names
  `pod_local_env`); every drop is recorded (`Dropped`) so the render can say what it left out;
- replaced: the Mooncake master's host:port by its Service, the service's
  own address by the pod IP marker (`POD_IP`), the release directory by
  `RELEASE_ROOT`, and the service name in file paths by the component's;
- refused: any other host address left over (`KubernetesRenderError`).

Nothing is parsed back out of argv to learn a setting: flags are only
removed, by name, where the Plan's own structure says the operator injects
them (the service is the frontend, or its slot spans hosts).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from primectl.errors import DeployError
from primectl.plan.model import RELEASE, Plan, Probe, Service

# Stands for the pod's own IP in a draft: `$(POD_IP)` in args, `status.podIP` in env.
POD_IP = "@pod_ip@"
# Where the release directory's files (generated model, configs, probes) are mounted in a pod.
RELEASE_ROOT = "/opt/primectl"

DISCOVERY = "the operator's Kubernetes discovery replaces etcd and the file store"
NAMESPACE = "the operator sets DYN_NAMESPACE=<k8s namespace>-<DGD name>"
POD_LOCAL = "a pod has one address, its own ports and only its own GPUs (the runtime picks the pod's)"
# Env the operator sets, or that only made sense on a host shared by several processes.
DROPPED_ENV: dict[str, str] = {
    "DYN_NAMESPACE": NAMESPACE,
    "DYN_DISCOVERY_BACKEND": DISCOVERY,
    "ETCD_ENDPOINTS": DISCOVERY,
    "ETCD_LEASE_TTL": DISCOVERY,
    "DYN_FILE_KV": DISCOVERY,
    "DYN_SYSTEM_HOST": POD_LOCAL,
    "DYN_SYSTEM_PORT": "the operator serves the system port as 9090 (`system`) on workers",
    "DYN_TCP_RPC_HOST": POD_LOCAL,
    "DYN_TCP_RPC_PORT": POD_LOCAL,
    "DYN_EVENT_PLANE_HOST": POD_LOCAL,
    "DYN_HTTP_RPC_HOST": POD_LOCAL,
    "DYN_TCP_RESPONSE_STREAM_HOST": POD_LOCAL,
    "DYN_TCP_RESPONSE_STREAM_PORT": POD_LOCAL,
    "CUDA_VISIBLE_DEVICES": POD_LOCAL,
}
# Frontend flags the operator provides (flag -> why); each takes one value.
FRONTEND_FLAGS: dict[str, str] = {
    "--namespace": NAMESPACE,
    "--http-host": "the frontend binds all pod addresses; the operator's Service fronts it",
    "--http-port": "the operator serves the frontend on port 8000 (`http`) and sets DYN_HTTP_PORT",
}
# The per-node flags the operator injects into a worker whose instance spans nodes are the engine's: its
# ContainerImage's multinode_dp_flags and multinode_tp_flags (flag -> values taken).
MULTINODE_DP = "the operator injects the per-node data-parallel flags (rank, address, RPC port, hybrid LB)"
MULTINODE_TP = ("the operator injects the multi-node tensor-parallel launch (executor backend, node count and rank, "
                "leader address and port, --headless on worker pods)")
PROBE_PERIOD_S = 5
IANA_SVC_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class KubernetesRenderError(DeployError):
    """The plan cannot be written as Kubernetes resources (a shape this target does not support, or a bug)."""


@dataclass(frozen=True)
class Dropped:
    """Something in the Plan the rendered pods leave out, and why."""

    component: str
    item: str
    reason: str


@dataclass(frozen=True)
class PodFile:
    """A Plan file as a pod sees it: path under RELEASE_ROOT, content, mode."""

    path: str
    content: str
    mode: int


@dataclass(frozen=True)
class ContainerDraft:
    """The `main` container of one pod, before it is written as YAML.

    Strings may hold `POD_IP`; `to_container` turns it into Kubernetes
    references. Two services of one component must have equal drafts.
    """

    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    files: tuple[PodFile, ...] = ()
    ports: tuple[tuple[str, int], ...] = ()
    probe: dict[str, object] | None = field(default=None, hash=False, compare=True)


def _address_re(address: str) -> re.Pattern[str]:
    """`address` as a whole token: 10.20.1.1 must not match inside 10.20.1.12 or tray010."""
    return re.compile(r"(?<![\w.-])" + re.escape(address) + r"(?![\w-]|\.\w)")


@dataclass(frozen=True)
class Rewrite:
    """How one service's strings become pod strings."""

    own_address: str
    endpoints: dict[str, str]  # "host:port" of another service -> its Service's "name:port"
    paths: dict[str, str]  # Plan file path -> pod file path (service name -> component name)

    def text(self, value: str) -> str:
        """`value` with endpoints, the own address, file paths and the release directory replaced."""
        for hostport, target in self.endpoints.items():
            value = re.sub(r"(?<![\w.-])" + re.escape(hostport) + r"(?!\d)", target, value)
        value = _address_re(self.own_address).sub(POD_IP, value)
        for old, new in self.paths.items():
            value = value.replace(f"{RELEASE}/{old}", f"{RELEASE}/{new}")
        return value.replace(RELEASE, RELEASE_ROOT)


def _strip_flags(argv: list[str], arity: dict[str, int]) -> tuple[list[str], list[str]]:
    """argv without the flags in `arity` (and their values, `--flag value` or `--flag=value`); the flags removed."""
    out: list[str] = []
    removed: list[str] = []
    skip = 0
    for word in argv:
        if skip:
            skip -= 1
            continue
        name = word.split("=", 1)[0]
        if name in arity:
            removed.append(name)
            skip = arity[name] if "=" not in word else 0
            continue
        out.append(word)
    return out, removed


def program(plan: Plan, svc: Service, exe: str) -> str:
    """The image's name for an executable of the service: the runtime's Python is `python3`, its tools by name."""
    runtime = plan.serving.runtime.get(svc.host)
    if runtime is not None and exe == runtime.python:
        return "python3"
    if runtime is not None and posixpath.dirname(exe) == posixpath.dirname(runtime.python):
        return posixpath.basename(exe)
    raise KubernetesRenderError(f"{svc.name}: {exe} is not a program of the host runtime, so no image provides it")


def _split_command(prog: str, rest: list[str], *, frontend: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """command/args as ai-dynamo 1.6.1 writes them: `python3 -m dynamo.vllm` + flags; the frontend `python3` + `-m ...`."""
    if not frontend and len(rest) >= 2 and rest[0] == "-m":
        return (prog, "-m", rest[1]), tuple(rest[2:])
    return (prog,), tuple(rest)


def _port_name(name: str) -> str:
    """A Plan port name as a Kubernetes port name (IANA service name: lowercase, `-`, at most 15)."""
    out = name.lower().replace("_", "-")[:15].strip("-")
    if not IANA_SVC_NAME.match(out):
        raise KubernetesRenderError(f"port name {name!r} cannot be a Kubernetes port name")
    return out


def _probe(plan: Plan, svc: Service, rw: Rewrite) -> dict[str, object]:
    """The service's readiness probe for a component the operator gives none (the Mooncake master)."""
    ready: Probe = svc.ready
    by_number = {v: _port_name(k) for k, v in svc.ports.items()}
    handler: dict[str, object]
    if ready.kind == "http" and ready.url:
        url = urlsplit(ready.url)
        if url.hostname != svc.address or url.port is None:
            raise KubernetesRenderError(f"{svc.name}: readiness URL {ready.url} is not on the service itself")
        handler = {"httpGet": {"path": url.path or "/", "port": by_number.get(url.port, url.port)}}
    elif ready.kind == "tcp" and ready.port:
        handler = {"tcpSocket": {"port": by_number.get(ready.port, ready.port)}}
    elif ready.kind == "command" and ready.command:
        words = [program(plan, svc, ready.command[0]), *(rw.text(w) for w in ready.command[1:])]
        if any(POD_IP in w for w in words):  # exec probes expand no $(VAR): let a shell read the pod's env
            script = "exec " + " ".join('"${POD_IP}"'.join(shlex.quote(p) if p else "" for p in w.split(POD_IP))
                                        for w in words)
            words = ["sh", "-c", script]
        handler = {"exec": {"command": words}}
    else:
        raise KubernetesRenderError(f"{svc.name}: readiness probe {ready.kind} cannot be written for a pod")
    timeout = max(1, min(PROBE_PERIOD_S, int(ready.timeout_s)))
    return {**handler, "periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": timeout}


def container_draft(
    plan: Plan, svc: Service, component: str, *, frontend: bool, multinode: bool, typeless: bool,
    endpoints: dict[str, str],
) -> tuple[ContainerDraft, list[Dropped]]:
    """The `main` container for `svc` as a pod of `component`, and what was left out of it.

    `frontend`: drop the flags the operator provides the frontend; `multinode`:
    the instance spans nodes, drop the per-node DP flags the operator injects;
    `typeless`: the operator adds no ports or probes, so carry the Plan's.
    """
    dropped: list[Dropped] = []
    image = plan.serving.image
    argv = list(svc.argv[1:])
    if frontend:
        argv, gone = _strip_flags(argv, dict.fromkeys(FRONTEND_FLAGS, 1))
        dropped += [Dropped(component, f"flag {f}", FRONTEND_FLAGS[f]) for f in gone]
    if multinode and image is not None:
        argv, gone = _strip_flags(argv, image.multinode_dp_flags)
        dropped += [Dropped(component, f"flag {f}", MULTINODE_DP) for f in gone]
        argv, gone = _strip_flags(argv, image.multinode_tp_flags)
        dropped += [Dropped(component, f"flag {f}", MULTINODE_TP) for f in dict.fromkeys(gone)]
    component_key = component.lower()
    paths = {f.path: f.path.replace(svc.name, component_key) for f in svc.files if svc.name in f.path}
    rw = Rewrite(svc.address, endpoints, paths)
    command, args = _split_command(program(plan, svc, svc.argv[0]), [rw.text(w) for w in argv], frontend=frontend)
    env: list[tuple[str, str]] = []
    drop_env = DROPPED_ENV | (dict.fromkeys(image.pod_local_env, POD_LOCAL) if image is not None and not frontend else {})
    for name, value in svc.env.items():
        if name in drop_env:
            dropped.append(Dropped(component, f"env {name}", drop_env[name]))
        else:
            env.append((name, rw.text(value)))
    files = tuple(PodFile(paths.get(f.path, f.path), rw.text(f.content), f.mode) for f in svc.files)
    ports: tuple[tuple[str, int], ...] = ()
    probe = None
    if typeless:
        ports = tuple((_port_name(k), v) for k, v in svc.ports.items())
        probe = _probe(plan, svc, rw)
    else:
        if svc.ports:
            dropped.append(Dropped(component, "declared ports",
                                   "pod-to-pod traffic needs no declared port; the operator declares its own"))
        dropped.append(Dropped(component, f"readiness probe ({svc.ready.kind})",
                               "the operator adds liveness, readiness and startup probes (workers may start for 2 h)"))
    draft = ContainerDraft(command, args, tuple(env), files, ports, probe)
    check_no_host_address(plan, svc, draft)
    return draft, dropped


def normalise_ports(draft: ContainerDraft, ports: dict[str, int], canonical: dict[str, int]) -> ContainerDraft:
    """The draft with this slot's port numbers replaced by the first instance's (each pod has its own ports)."""
    subs = {str(ports[k]): str(canonical[k]) for k in ports if k in canonical and ports[k] != canonical[k]}
    if not subs:
        return draft
    pattern = re.compile(r"(?<!\d)(" + "|".join(map(re.escape, subs)) + r")(?!\d)")

    def fix(text: str) -> str:
        return pattern.sub(lambda m: subs[m.group(1)], text)

    return replace(
        draft, args=tuple(fix(a) for a in draft.args), env=tuple((k, fix(v)) for k, v in draft.env),
        files=tuple(replace(f, content=fix(f.content)) for f in draft.files),
    )


def check_no_host_address(plan: Plan, svc: Service, draft: ContainerDraft) -> None:
    """No host address of the plan may reach a pod: it would point one pod at a machine, not at a pod."""
    texts = [*(f"args {a}" for a in draft.args), *(f"env {k}={v}" for k, v in draft.env),
             *(f"file {f.path}: {f.content}" for f in draft.files), f"probe {draft.probe}"]
    for host in plan.hosts:
        pattern = _address_re(host.address)
        for text in texts:
            if pattern.search(text):
                raise KubernetesRenderError(
                    f"{svc.name}: the address of host {host.name} ({host.address}) would reach the pod in {text[:120]!r}; "
                    "the kubernetes target knows no pod or Service for it")
