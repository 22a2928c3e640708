"""What primectl and its host agent say to each other: the request and result types of the agent's operations
(`agent.OPS` lists them), and the state.json schema (`HostState`, `ServiceRecord`).

Wire format: one JSON object per request `{"op": NAME, "args": {...}}` and one
per result; every result has `ok` and `code` (0 ok, 1 failed, 3 a service
exited while we waited, 4 timed out) and, when not ok, `error`.
"""

from __future__ import annotations

import sys

# A host agent starts for every connection, so the host package imports only what every operation needs:
# typing alone would cost as much as the rest. Types are for mypy (TYPE_CHECKING here is False at run time,
# without importing typing), and a TypedDict on a host only names a dict.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypedDict
elif "typing" in sys.modules:  # loaded already (primectl's own process): the real TypedDict costs nothing
    from typing import TypedDict
else:
    class TypedDict(dict):  # type: ignore[no-redef]
        """On a host, a TypedDict only names a dict."""

        def __init_subclass__(cls, total: bool = True) -> None:
            pass


STATE_SCHEMA = 2
CODE_OK, CODE_FAILED, CODE_EXITED, CODE_TIMEOUT = 0, 1, 3, 4


class DrainSpec(TypedDict, total=False):
    """How a service leaves routing and empties before it stops (the Plan's Drain as JSON)."""

    how: str  # signal | balancer
    inflight_url: str | None
    inflight_metrics: list[str]
    socket: str | None
    server: str | None
    address: str | None
    timeout_s: float


class ReloadSpec(TypedDict, total=False):
    """How a running service re-reads its files in place (the Plan's Reload as JSON)."""

    signal: str
    socket: str | None
    backend: str | None
    servers: list[str]
    state_file: str | None
    check: list[str]
    timeout_s: float


class Drained(TypedDict, total=False):
    """What draining one service took: how long, and how many in-flight requests were cut at its timeout."""

    seconds: float
    cut: int
    how: str


class ProbeSpec(TypedDict, total=False):
    """A readiness probe (the Plan's Probe as JSON)."""

    kind: str
    url: str | None
    json_path: str | None
    json_expect: Any
    expect_text: str | None  # http: also require the answer to contain this text (else: TEXT_MISSING ...)
    host: str | None
    port: int | None
    command: list[str] | None
    expect_status: int
    timeout_s: float
    interval_s: float


class ServiceRecord(TypedDict, total=False):
    """What state.json records about one service."""

    hash: str  # run hash: argv, env, files, binding (a change restarts)
    files_hash: str
    expect_hash: str  # readiness and ordering (a change is recorded, no restart)
    fields: dict[str, str]  # a hash per Service field, so `diff` can say which changed
    unit: str
    role: str
    release: str
    listens: list[int]
    ready: ProbeSpec
    stop_timeout: float
    drain: DrainSpec


class HostState(TypedDict, total=False):
    """state.json: what runs on this host for one deployment."""

    schema: int
    deployment: str
    revision: str | None
    previous_revision: str | None
    supervisor: str
    secrets_hash: str
    updated: float
    services: dict[str, ServiceRecord]
    # every host of the deployment (HostPlan fields), so dropped hosts are found: on the roster's keepers only
    # (the head host and two others), so that no host's state grows with the fleet; {} on the others
    roster: dict[str, dict[str, Any]]
    roster_keepers: dict[str, dict[str, Any]]  # the hosts that keep the roster (HostPlan fields), on every host
    roster_stamp: float  # when the `up` that wrote this roster (and named its keepers) recorded it
    retired: bool


class ServiceRef(TypedDict, total=False):
    """A service an operation acts on (`drain`: empty it before it stops; `reload`: how it re-reads its files)."""

    name: str
    unit: str
    stop_timeout: float
    drain: DrainSpec
    reload: ReloadSpec


class WaitSpec(TypedDict, total=False):
    """Wait for `probe`; fail fast if `unit` is given and its process exits."""

    name: str
    unit: str
    probe: ProbeSpec


class Liveness(TypedDict, total=False):
    """Whether a service's process runs, as its supervisor sees it."""

    alive: bool
    pid: int | None
    state: str  # supervisor's view, e.g. "running", "activating (auto-restart)", "failed"
    restarts: int  # restarts the supervisor did by itself (systemd NRestarts)
    release: str  # the revision it was started from (a running service only; absent when not known)
    installed: bool  # its unit is installed, running or not (supervisors with units: systemd)


class Result(TypedDict, total=False):
    """Fields every result has."""

    ok: bool
    code: int
    error: str
    service: str


class InspectResult(Result, total=False):
    state: HostState | None
    current: str | None
    services: dict[str, Liveness]
    lock: dict[str, Any] | None
    taken: list[int]
    releases: list[str]
    time: float
    probes: dict[str, dict[str, Any]]  # with `probes` in the request (`status`): name -> {ok, detail}


class LockResult(Result, total=False):
    owner: dict[str, Any]
    stale: bool


class StartResult(Result, total=False):
    pids: dict[str, int | None]
    ready: list[str]
    seconds: float
    drained: dict[str, Drained]


class ReloadResult(StartResult, total=False):
    reloaded: list[str]  # the others did not run and were started


class StopResult(Result, total=False):
    stopped: list[str]
    drained: dict[str, Drained]


class ProbeResult(Result, total=False):
    results: dict[str, dict[str, Any]]


class TailResult(Result, total=False):
    logs: dict[str, str]


class SpawnResult(Result, total=False):
    pid: int


class ReadResult(Result, total=False):
    text: str


class ServiceProgress(TypedDict, total=False):
    """How one awaited service stands (in a progress line of `wait`/`start_wait`)."""

    name: str
    phase: str  # "starting", "waiting" (its probe did not pass yet), "ready", "exited", "timeout"
    elapsed: float  # seconds since the wait began
    budget: float  # its probe's timeout_s
    probe: str  # what its probe saw last ("" before the first try)
    log: str  # the last line of its log file ("" when it has none)


class Progress(TypedDict):
    """A line an operation writes before its result when the request asks for it (`progress_s` in args).

    Results always have `ok`; progress lines never do, so a reader tells them apart by the `progress` key."""

    progress: list[ServiceProgress]


class InstallProgress(Result, total=False):
    """`install_progress`: how far a runtime install is, read from its venv and pip's log."""

    installed: int  # distributions in the venv's site-packages (*.dist-info)
    venv_mb: float  # size of the venv
    collected: int  # packages pip has collected (downloaded or found in the wheelhouse)
    downloaded_mb: float  # sizes pip printed for its downloads
    last: str  # the log's last line
