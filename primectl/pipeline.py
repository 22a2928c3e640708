"""`up`: the one home of the ordered steps that take a plan to its machines.

Read top to bottom, `up` is:

    connect -> lock -> diff -> preflight -> provision -> ports -> push -> activate
    -> stop removed -> waves -> gate -> smoke -> record -> retire (-> unlock)

`primectl up`, `primectl ab` and every other caller go through `up`; `diff`
and `up --dry-run` print `describe`, the same step list with what each step
would do. The target (SSH push, Slurm job, ...) supplies the rollout that
performs each step. Any failure before `activate` changes nothing; any failure
after it rolls the changed services back to the previous revision and waits
until that revision is healthy again, and so does Ctrl-C.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from primectl.alerting import quiet
from primectl.deploy.changes import Change
from primectl.errors import DeployError, Interrupted, Problem, RecipeError
from primectl.plan.model import Plan
from primectl.targets.base import Rollout, StepPlan
from primectl.targets.base import get as get_target

Say = Callable[[str], None]


@dataclass(frozen=True)
class UpOptions:
    """Everything that changes how `up` runs (one value, passed down unchanged)."""

    connection: object = None  # the target's connection policy (SSH: deploy.cluster.ConnectionPolicy)
    break_lock: bool = False
    preflight: bool = True
    smoke: bool = True
    wheelhouse: Path | None = None
    dry_run: bool = False
    recipe_file: str = "recipe"  # named in errors about secrets


@dataclass
class UpResult:
    """What `up` did."""

    changes: list[Change]
    started: list[str] = field(default_factory=list)
    seconds: float = 0.0
    steps: list[StepPlan] = field(default_factory=list)  # with --dry-run: what it would have done


def resolve_secrets(plan: Plan, file: str) -> str:
    """Secret values as an env file, read on this machine; bad input (exit 2) when a source is missing."""
    lines, problems = [], []
    for name in plan.secret_names:
        source = plan.secret_sources.get(name, "")
        kind, _, ref = source.partition(":")
        value: str | None = None
        if kind == "env":
            value = os.environ.get(ref)
        elif kind == "file":
            try:
                with open(os.path.expanduser(ref)) as f:
                    value = f.read().strip()
            except OSError:
                value = None
        if value is None:
            problems.append(Problem(file, 0, 0, f"secrets.{name}",
                                    f"{source!r} has no value here (set the env var or create the file); "
                                    "allowed: env:NAME or file:PATH"))
            continue
        lines.append(f"{name}={shlex.quote(value)}")
    if problems:
        raise RecipeError(problems)
    return "".join(line + "\n" for line in lines)


def up(plan: Plan, options: UpOptions, say: Say) -> UpResult:
    """Bring the deployment to the plan; roll back on failure (DeployError) or Ctrl-C."""
    t0 = time.monotonic()
    secrets = resolve_secrets(plan, options.recipe_file)  # bad input is refused before any host is touched
    target = get_target(plan.target.kind)
    with target.apply(plan, options.connection, say) as run:  # connect
        if options.dry_run:
            lines = run.diff(secrets, detail=True)
            return UpResult(lines, steps=run.describe(preflight=options.preflight, smoke=options.smoke),
                            seconds=time.monotonic() - t0)
        try:  # the lock taken inside: a Ctrl-C while the head host takes it still releases it
            run.lock(break_lock=options.break_lock)
            return _locked(run, options, secrets, say, t0)
        finally:
            run.unlock()


def _locked(run: Rollout, options: UpOptions, secrets: str, say: Say, t0: float) -> UpResult:
    lines = run.diff(secrets)
    quiet.lift_stale(run.plan, say)  # we hold the lock: a silence still set is a dead change's
    if run.nothing_to_do():
        say("no changes: every service is running its planned revision")
        return UpResult(lines, seconds=time.monotonic() - t0)
    with quiet.quiet_change(run.plan, lines, say, why="primectl up: a change of the deployment"):
        return _change(run, options, secrets, say, t0, lines)


def _change(run: Rollout, options: UpOptions, secrets: str, say: Say, t0: float, lines: list[Change]) -> UpResult:
    # Preflight and provisioning run only when something is about to change, under the lock,
    # so a concurrent `up` is refused as locked, not mistaken for a host problem.
    if options.preflight:
        run.preflight()
    run.provision(options.wheelhouse)
    run.check_ports()
    run.push()
    started: list[str] = []
    try:
        run.activate(secrets)
        run.stop_removed()
        for wave in run.waves():
            say(f"starting {', '.join(wave)}")
            started += wave
            run.start(wave)
        run.gate()
        if options.smoke:
            smoke(run.plan)  # the bound plan: a scheduler target knows the addresses only once the job runs
    except DeployError as exc:
        say(f"FAILED: {exc}; rolling back")
        run.rollback()
        raise DeployError(f"{exc} (rolled back to the previous revision)",
                          service=exc.service, log_tail=exc.log_tail) from None
    except KeyboardInterrupt:
        # Ctrl-C mid-rollout: put the previous revision back rather than leave a mix (a second Ctrl-C aborts).
        say("interrupted: rolling back to the previous revision")
        run.rollback()
        raise Interrupted("interrupted by the operator (rolled back to the previous revision)") from None
    run.record()
    run.retire()
    say(f"ready: {run.plan.endpoint} ({run.summary()})")
    if run.plan.monitoring is not None:
        say(f"monitoring: prometheus {run.plan.monitoring.prometheus_url}, "
            f"alertmanager {run.plan.monitoring.alertmanager_url}")
    return UpResult(lines, started, time.monotonic() - t0)


def smoke(plan: Plan) -> None:
    """The endpoint smoke tests `up` runs last: DeployError (so `up` rolls back) if any check fails."""
    from primectl.checks.smoke import smoke_gate

    smoke_gate(plan)


def diff(plan: Plan, connection: object, say: Say, *, preflight: bool = True, smoke: bool = True
         ) -> tuple[list[Change], list[StepPlan]]:
    """What `up` would change and do, touching nothing."""
    target = get_target(plan.target.kind)
    with target.apply(plan, connection, say) as run:
        lines = run.diff(None, detail=True)  # diff never needs the secret values
        return lines, run.describe(preflight=preflight, smoke=smoke)


def print_diff(lines: list[Change], steps: list[StepPlan], stream: TextIO | None = None) -> bool:
    """The per-service changes (with run-script diffs), then what each step of `up` would do; any changes?"""
    from primectl.deploy.changes import MARKS
    from primectl.output import print_table

    stream = stream or sys.stdout
    todo = [c for c in lines if c.action != "keep"]
    for c in lines:
        stream.write(f"{MARKS[c.action]} {c.host:12} {c.service:20} {c.action:8} {c.reason}\n")
        if c.detail:
            stream.write(c.detail)
    stream.write(f"{len(todo)} to change, {len(lines) - len(todo)} unchanged\n" if todo else "no changes\n")
    if steps:
        stream.write("\n")
        print_table("what `up` would do", ["step", "action"],
                    [[s.step, s.action + "".join(f"\n  {d}" for d in s.details)] for s in steps], fold="action",
                    stream=stream)
    return bool(todo)
