"""The Target protocols: how planned processes reach machines.

Engines say what runs; targets say where and how it starts. A target is one
class in one module, registered as an entry point in group `primectl.targets`
(primectl.registry). It has two parts:

- what renders (`RenderTarget`): it plans the recipe's hosts (`plan_hosts`),
  binds the plan's logical slots to machines (`bind`) and renders what it
  ships (`render`, what `primectl render` writes);
- what deploys (`Deploys`): it opens a rollout that the one `up` pipeline
  (primectl/pipeline.py) drives step by step (`apply`), and reads and stops
  what runs (`status`, `logs`, `down`, `unlock`).

Every command of the deploy part takes the target's own options (the protocols are generic over their type:
SSH's is its ConnectionPolicy, Slurm's its SlurmClient), which the target builds itself (`connection_options`);
each target module states its type where mypy checks it against the protocols.

A render-only target implements the first part only; `get` hands it out
wrapped so that `up`, `diff`, `status`, `logs`, `down` and `unlock` refuse it
with one message (exit 2) naming `primectl render`, and what its optional
`instead(plan, command, service)` says to run instead. The built-in ones are
SSH/local push (targets/ssh.py) and Slurm (targets/slurm.py), which deploy,
and Kubernetes (targets/kubernetes.py), which renders only.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, runtime_checkable

from primectl import registry
from primectl.deploy.changes import Change
from primectl.errors import DeployError, Refused
from primectl.plan.model import HostPlan, Plan
from primectl.recipe.model import Recipe

if TYPE_CHECKING:
    from primectl.deploy.status import StatusReport

Say = Callable[[str], None]
# A target's options: what its commands reach its machines with (SSH: a ConnectionPolicy; Slurm: its SlurmClient),
# built by the target (`connection_options`). None asks for the target's defaults.
Options = TypeVar("Options", contravariant=True)
Built = TypeVar("Built", covariant=True)


class StartFailed(DeployError):
    """A service (or the job holding it) did not start or become ready; rollback follows."""


@dataclass(frozen=True)
class StepPlan:
    """What one step of `up` would do (for `diff` and `up --dry-run`)."""

    step: str
    action: str
    details: list[str] = field(default_factory=list)


# One service's pending change, as `diff` prints it: the one change type of every target
# (primectl.deploy.changes.Change, action a Literal), under the name the Rollout protocol has always used.
ChangeLine = Change


@dataclass(frozen=True)
class PlannedHosts:
    """The recipe's hosts as a target plans them.

    `runtime_root`: where provisioned runtime venvs live (`<root>/<key>`), the same for every host;
    None: under each host's own workdir. `options`: the target's recipe block as plain data (Plan.target.options).
    """

    hosts: list[HostPlan]
    runtime_root: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


class Rollout(Protocol):
    """An open deployment on a target: the operations the `up` pipeline calls, in its order."""

    plan: Plan

    def lock(self, *, break_lock: bool) -> None:
        """Take the deployment's lock (DeployError naming the holder when it is held)."""
        ...

    def unlock(self) -> None:
        """Release the lock (best effort)."""
        ...

    def diff(self, secrets: str | None, *, detail: bool = False) -> list[Change]:
        """Every service's change (keep included; `deploy.changes.diff_services` makes them); computes the rollout.

        `secrets` None: do not compare them; `detail`: also fetch what `diff` shows (e.g. run-script diffs).
        """
        ...

    def nothing_to_do(self) -> bool:
        """No service changes and the secrets are current."""
        ...

    def describe(self, *, preflight: bool, smoke: bool) -> list[StepPlan]:
        """What each step would do, without doing it."""
        ...

    def preflight(self) -> None:
        """Check the machines before anything changes (DeployError: nothing was changed)."""
        ...

    def provision(self, wheelhouse: Path | None) -> None:
        """Create or reuse the runtime on each machine."""
        ...

    def check_ports(self) -> None:
        """Every port a starting service needs is free (DeployError: nothing was changed)."""
        ...

    def push(self) -> None:
        """Ship the new release to the machines that need it."""
        ...

    def activate(self, secrets: str) -> None:
        """Make the new release current (and write secrets); from here a failure rolls back."""
        ...

    def stop_removed(self) -> None:
        """Stop services the plan no longer has."""
        ...

    def waves(self) -> list[list[str]]:
        """The services to (re)start, grouped in dependency order."""
        ...

    def start(self, wave: list[str]) -> None:
        """Start one wave and wait until each service is ready (DeployError naming the one that failed)."""
        ...

    def gate(self) -> None:
        """Wait for the deployment's readiness gate."""
        ...

    def rollback(self) -> None:
        """Put the previous revision back and wait until it is healthy."""
        ...

    def record(self) -> None:
        """Record what now runs (state on the machines)."""
        ...

    def retire(self) -> None:
        """Forget machines the recipe dropped."""
        ...

    def summary(self) -> str:
        """One line: how many services started and stayed."""
        ...


class RenderTarget(Protocol):
    """What renders: every target has this part (a render-only target has nothing else)."""

    name: str
    # Whether it can start a worker's surge twin beside it during a change (then each configuration of the
    # workers registers as a generation of its own); a scheduler or an operator replaces workers its own way.
    surges: bool

    def plan_hosts(self, recipe: Recipe, hosts: list[HostPlan]) -> PlannedHosts:
        """The hosts as this target plans them (SSH: as the recipe names them; a scheduler: logical node slots)."""
        ...

    def bind(self, plan: Plan) -> Plan:
        """The plan with its slots bound to machines (a target that binds at plan time returns it unchanged)."""
        ...

    def render(self, plan: Plan) -> dict[str, bytes]:
        """What this target ships, as {relative path: content} (`primectl render`)."""
        ...


@runtime_checkable
class Deploys(Protocol[Options]):
    """What deploys: a target that `up` can drive, and that reads and stops what runs, with its own options."""

    def apply(self, plan: Plan, options: Options | None, say: Say) -> AbstractContextManager[Rollout]:
        """Open a rollout (connections, inspection) that `up` drives; closed on exit."""
        ...

    def status(self, plan: Plan, options: Options | None, say: Say) -> StatusReport:
        """What runs and whether it is healthy."""
        ...

    def logs(self, plan: Plan, service: str, options: Options | None, *, follow: bool, tail: int, journal: bool = False) -> int:
        """Print a service's log (with `journal`, what its supervisor logged about it); the exit code."""
        ...

    def down(self, plan: Plan, options: Options | None, say: Say, *, purge: bool, break_lock: bool) -> list[str]:
        """Stop every service in reverse start order; the names stopped."""
        ...

    def unlock(self, plan: Plan, options: Options | None, say: Say) -> str:
        """Break the deployment's lock; where it was."""
        ...


@runtime_checkable
class ReachesHosts(Protocol[Options]):
    """What a target that reaches each machine itself adds: the host commands `preflight`, `provision`, `doctor`,
    `drain` and `restart`. A scheduler's or an operator's target checks, installs and replaces in `up` instead."""

    def preflight(self, plan: Plan, options: Options | None, say: Say, *, selftest: bool, fabric: bool) -> Any:
        """Check every machine (unreachable ones are reported, not fatal); a report with `ok`."""
        ...

    def provision(self, plan: Plan, options: Options | None, say: Say, *, wheelhouse: Path | None) -> None:
        """Create or reuse the pinned runtime on every machine."""
        ...

    def doctor(self, plan: Plan, options: Options | None, say: Say) -> tuple[list[str], int]:
        """Installed runtime versions per machine against the pins: report lines and how many drifted."""
        ...

    def drain(self, plan: Plan, service: str, options: Options | None, say: Say, *, restart: bool, break_lock: bool) -> None:
        """Take one service out of routing, let its work finish, stop it (`restart`: and bring it back)."""
        ...


def host_commands(target: RenderTarget | AnyTarget, plan: Plan, command: str) -> AnyHostCommands:
    """The target as the one that runs `primectl <command>` on its machines, or the refusal that says where the
    target does that instead (a render-only target: `primectl render`, exit 2)."""
    if isinstance(target, ReachesHosts):
        return target
    if isinstance(target, RenderOnly):
        raise target.refused(plan, command)
    raise DeployError(f"`primectl {command}` runs on targets that reach each host themselves; target {plan.target.kind} "
                      "checks and provisions in `primectl up`, and replaces a service by running `up` again "
                      "(`up --dry-run` shows what it would do)")


class Target(RenderTarget, Deploys[Options], Protocol):
    """A target with both parts, as `get` hands every target out (a render-only one wrapped in RenderOnly)."""


class BuildsOptions(Protocol[Built]):
    """A target that builds the options its commands connect with (optional: one without them gets None)."""

    def connection_options(self, plan: Plan, *, accept_new_host_keys: bool) -> Built:
        """The options, checked before any machine is reached (bad settings refused here)."""
        ...


# A target as the registry hands it out: which options it takes only the target knows, so a caller passes what
# the target's own `connection_options` built (or None, its defaults).
AnyTarget = Target[Any]
AnyHostCommands = ReachesHosts[Any]


class RenderOnly:
    """A render-only target as a Target: it renders; every command that would deploy refuses (Refused, exit 2)."""

    def __init__(self, target: RenderTarget):
        self.target = target
        self.name = target.name
        self.surges = target.surges

    def __getattr__(self, attr: str) -> Any:  # the target's optional extras, e.g. render_report
        return getattr(self.target, attr)

    def plan_hosts(self, recipe: Recipe, hosts: list[HostPlan]) -> PlannedHosts:
        """The target's own."""
        return self.target.plan_hosts(recipe, hosts)

    def bind(self, plan: Plan) -> Plan:
        """The target's own."""
        return self.target.bind(plan)

    def render(self, plan: Plan) -> dict[str, bytes]:
        """The target's own."""
        return self.target.render(plan)

    def refused(self, plan: Plan, command: str, service: str | None = None) -> Refused:
        """The one refusal: use `primectl render`, and what the target says to run instead."""
        instead = getattr(self.target, "instead", None)
        hint = instead(plan, command, service) if callable(instead) else None
        return Refused(f"target {self.name} renders only; use `primectl render RECIPE -o DIR` "
                       f"(`primectl {command}` does not apply to it)" + (f", then: {hint}" if hint else ""))

    def apply(self, plan: Plan, options: object, say: Say) -> AbstractContextManager[Rollout]:
        """Refused."""
        raise self.refused(plan, "up` / `diff")

    def status(self, plan: Plan, options: object, say: Say) -> StatusReport:
        """Refused."""
        raise self.refused(plan, "status")

    def logs(self, plan: Plan, service: str, options: object, *, follow: bool, tail: int, journal: bool = False) -> int:
        """Refused."""
        raise self.refused(plan, "logs", service)

    def down(self, plan: Plan, options: object, say: Say, *, purge: bool, break_lock: bool) -> list[str]:
        """Refused."""
        raise self.refused(plan, "down")

    def unlock(self, plan: Plan, options: object, say: Say) -> str:
        """Refused."""
        raise self.refused(plan, "unlock")


def load(name: str) -> RenderTarget:
    """The registered target called `name`, as it is (KeyError if none; registry.PluginError if broken or incomplete)."""
    obj = registry.target(name)
    missing = registry.missing_members(obj, RenderTarget)
    if missing:
        raise registry.PluginError("target", name, f"target {name!r} lacks {', '.join(missing)} of the RenderTarget "
                                                   f"protocol (primectl.targets.base; {registry.entry('target', name).describe()})")
    return cast(RenderTarget, obj)


def deploys(target: RenderTarget) -> bool:
    """Whether the target implements the deploy part too."""
    return isinstance(target, Deploys)


def get(name: str) -> AnyTarget:
    """The registered target called `name` (KeyError if none); a render-only one wrapped so deploying refuses."""
    obj = load(name)
    return cast(AnyTarget, obj) if deploys(obj) else RenderOnly(obj)


def render_for_target(plan: Plan, out: Path) -> list[str]:
    """Write what the plan's target ships under `out` (`primectl render`); one line per thing written, for the operator."""
    kind = plan.target.kind
    chosen = get(kind)
    # A target may write what it renders its own way (ssh: one release directory per host, with its manifest).
    write = getattr(chosen, "write_render", None)
    if callable(write):
        written: list[str] = write(plan, out)
        return written
    files = chosen.render(plan)
    for rel, data in sorted(files.items()):
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o755 if data.startswith(b"#!") else 0o644)  # scripts stay runnable
    # A target may say more about what it rendered (kubernetes: which schemas the manifests were checked against).
    report = getattr(chosen, "render_report", None)
    extra: list[str] = report(plan) if callable(report) else []
    return [f"{out / rel}" for rel in sorted(files)] + [f"{len(files)} files written for target {kind}", *extra]


def connection_options(target: object, plan: Plan, *, accept_new_host_keys: bool) -> object:
    """The options the target's commands connect with, built by the target (BuildsOptions); None for a target that
    declares none (it builds its own, or reaches no host)."""
    declared = getattr(target, "connection_options", None)
    return declared(plan, accept_new_host_keys=accept_new_host_keys) if callable(declared) else None
