"""The `primectl` command line: parse options, call one function, map errors to exit codes.

Exit codes: 0 success, 1 deployment failure, 2 bad input. Heavy modules are
imported inside the commands so `primectl --help` stays fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from primectl.errors import EXIT_BAD_INPUT, EXIT_FAILURE, DeployError, RecipeError

if TYPE_CHECKING:
    from primectl.deploy.rollout import Cluster
    from primectl.plan.model import Plan
    from primectl.recipe.load import LoadedRecipe

app = typer.Typer(
    help="Deploy disaggregated LLM serving (Dynamo + vLLM/mocker + NIXL + Mooncake) from a recipe.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)

T = TypeVar("T")


class Output(StrEnum):
    """Output formats."""

    table = "table"
    json = "json"


RecipeArg = Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)]
OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table or json.")]


def _guard(fn: Callable[[], T]) -> T:
    """Run a command body; print errors the way operators need them and exit with the right code."""
    from rich.console import Console

    err = Console(stderr=True)
    try:
        return fn()
    except RecipeError as exc:
        n = len(exc.problems)
        err.print(f"[bold red]error:[/] {n} problem{'s' if n != 1 else ''} in the recipe; nothing was changed")
        for p in exc.problems:
            err.print(f"  {p}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except DeployError as exc:
        err.print(f"[bold red]failed:[/] {exc}", highlight=False, soft_wrap=True)
        if exc.log_tail:
            err.print(f"--- last lines of {exc.service}'s log ---", highlight=False)
            err.print(exc.log_tail, markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_FAILURE) from None


def load(path: Path) -> LoadedRecipe:
    """Load and fully validate a recipe (RecipeError on any problem)."""
    from primectl.recipe.load import load_recipe

    return load_recipe(path)


def load_plan(path: Path) -> tuple[LoadedRecipe, Plan]:
    """Validate a recipe and plan it."""
    from primectl.plan.build import build_plan

    loaded = load(path)
    return loaded, build_plan(loaded.recipe)


@app.command()
def validate(recipe: RecipeArg) -> None:
    """Check a recipe: schema, GPU accounting, memory fit, KV formats, versions, engine flags."""

    def body() -> None:
        _, plan = load_plan(recipe)
        typer.echo(f"{recipe}: valid ({len(plan.services)} services on {len({s.host for s in plan.services})} hosts)")

    _guard(body)


@app.command()
def plan(recipe: RecipeArg, output: OutputOpt = Output.table) -> None:
    """Show what would run where: placement, capacity and the defaults the recipe left out."""

    def body() -> None:
        _, p = load_plan(recipe)
        if output is Output.json:
            sys.stdout.write(p.model_dump_json(indent=2) + "\n")
            return
        from primectl.report import print_plan

        print_plan(p)

    _guard(body)


@app.command()
def render(
    recipe: RecipeArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the per-host bundles.")] = Path("out"),
) -> None:
    """Write per-host bundles (run scripts, systemd units, configs, manifest) to a directory."""

    def body() -> None:
        from primectl.render.bundle import render_plan, write_bundles

        loaded, p = load_plan(recipe)
        bundles = render_plan(p, generate_model=bool(loaded.recipe.model.generate),
                              max_context=loaded.recipe.model.max_context or 32768)
        written = write_bundles(bundles, out)
        for host, b in sorted(bundles.items()):
            typer.echo(f"{out / host}: revision {b.revision}, {len(b.manifest['services'])} services")  # type: ignore[arg-type]
        typer.echo(f"{len(written)} files written")

    _guard(body)


@app.command()
def schema() -> None:
    """Print the recipe JSON Schema (for editors: yaml-language-server)."""
    import json

    from primectl.recipe.model import Recipe

    doc = Recipe.model_json_schema()
    doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    doc["title"] = "primectl recipe"
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


AcceptKeysOpt = Annotated[bool, typer.Option("--accept-new-host-keys",
                                             help="Trust and record unknown SSH host keys (changed keys are still refused).")]
BreakLockOpt = Annotated[bool, typer.Option("--break-lock", help="Break another run's cluster lock.")]


def _bundles(loaded: LoadedRecipe, p: Plan) -> dict[str, Any]:
    from primectl.render.bundle import render_plan

    return render_plan(p, generate_model=bool(loaded.recipe.model.generate),
                       max_context=loaded.recipe.model.max_context or 32768)


@contextmanager
def connected(recipe: Path, accept_new_host_keys: bool, *, head_only: bool = False, include_dropped: bool = False
              ) -> Iterator[tuple[LoadedRecipe, Plan, Cluster]]:
    """Load and plan a recipe, connect to its hosts (or only the frontend host; or also the hosts
    the recipe dropped since the last `up`), close them afterwards."""
    from primectl.deploy.rollout import open_cluster

    loaded, p = load_plan(recipe)
    hosts = [p.service("frontend").host] if head_only else p.deployed_hosts()
    cluster = open_cluster(p, hosts, known_hosts=loaded.recipe.known_hosts,
                           accept_new_host_keys=accept_new_host_keys, say=_say, include_dropped=include_dropped)
    try:
        yield loaded, p, cluster
    finally:
        cluster.close()


def _emit_report(report: Any, output: Output, print_table: Callable[[Any, Any], None]) -> int:
    """Print a check report (smoke, preflight) as JSON or a table; exit 1 when any check failed."""
    import json

    from rich.console import Console

    if output is Output.json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
    else:
        print_table(report, Console())
    return 0 if report.ok else EXIT_FAILURE


def _say(msg: str) -> None:
    from rich.console import Console

    Console(stderr=True, highlight=False).print(msg, markup=False, soft_wrap=True)


@app.command()
def up(
    recipe: RecipeArg,
    accept_new_host_keys: AcceptKeysOpt = False,
    break_lock: BreakLockOpt = False,
    no_smoke: Annotated[bool, typer.Option("--no-smoke", help="Skip the endpoint smoke tests after readiness.")] = False,
    wheelhouse: Annotated[Path | None, typer.Option("--wheelhouse", help="Provision offline from these wheels.")] = None,
    skip_preflight: Annotated[bool, typer.Option("--skip-preflight", help="Do not run `primectl preflight` first.")] = False,
) -> None:
    """Push, start in dependency order, wait for readiness; roll back on failure."""

    def body() -> None:
        from primectl.deploy.rollout import resolve_secrets
        from primectl.deploy.rollout import up as do_up

        loaded, p = load_plan(recipe)
        secrets = resolve_secrets(p, dict(loaded.recipe.secrets), loaded.file)
        bundles = _bundles(loaded, p)
        after = None if no_smoke else _smoke_hook(loaded, p)

        def prepare(cluster: Any) -> None:
            # Runs under the cluster lock, so a concurrent `up` is refused as locked,
            # not mistaken for a host problem by preflight's port checks.
            if not skip_preflight:
                from primectl.checks.preflight import gate_up

                gate_up(p, loaded.recipe, accept_new_host_keys=accept_new_host_keys, say=_say)
            if not loaded.recipe.software.python:
                from primectl.deploy.provision import provision

                provision(cluster, wheelhouse=wheelhouse, say=_say)

        res = do_up(p, bundles, secrets=secrets, known_hosts=loaded.recipe.known_hosts,
                    accept_new_host_keys=accept_new_host_keys, break_lock=break_lock, say=_say, after_ready=after,
                    prepare=prepare)
        _say(f"done in {res.seconds:.1f}s")

    _guard(body)


def _smoke_hook(loaded: LoadedRecipe, p: Plan) -> Callable[[], None] | None:
    try:
        from primectl.checks.smoke import smoke_gate
    except ImportError:
        return None
    return lambda: smoke_gate(p, loaded.recipe)


@app.command()
def down(
    recipe: RecipeArg,
    purge: Annotated[bool, typer.Option("--purge", help="Also remove releases, state, logs and secrets.")] = False,
    accept_new_host_keys: AcceptKeysOpt = False,
    break_lock: BreakLockOpt = False,
) -> None:
    """Stop every service in reverse start order."""

    def body() -> None:
        from primectl.deploy.rollout import down as do_down

        loaded, p = load_plan(recipe)
        do_down(p, purge=purge, known_hosts=loaded.recipe.known_hosts, accept_new_host_keys=accept_new_host_keys,
                break_lock=break_lock, say=_say)

    _guard(body)


@app.command()
def diff(recipe: RecipeArg, accept_new_host_keys: AcceptKeysOpt = False) -> None:
    """Show what `up` would add, change, restart or remove, touching nothing. Exit 0 = no changes."""

    def body() -> int:
        from primectl.deploy.observe import render_diff

        with connected(recipe, accept_new_host_keys, include_dropped=True) as (loaded, p, cluster):
            changes, details = render_diff(cluster, _bundles(loaded, p))
        marks = {"add": "+", "change": "~", "restart": "!", "remove": "-", "keep": " "}
        pending = [c for c in changes if c.action != "keep"]
        for c in changes:
            typer.echo(f"{marks[c.action]} {c.host:12} {c.service:20} {c.action:8} {c.reason}")
            if c.service in details:
                typer.echo(details[c.service])
        typer.echo(f"{len(pending)} to change, {len(changes) - len(pending)} unchanged" if pending else "no changes")
        return 3 if pending else 0

    code = _guard(body)
    raise typer.Exit(code)


@app.command()
def status(
    recipe: RecipeArg,
    output: OutputOpt = Output.table,
    watch: Annotated[float, typer.Option("--watch", help="Refresh every N seconds (0 = once).")] = 0,
    accept_new_host_keys: AcceptKeysOpt = False,
) -> None:
    """Live state of every service; exit 1 if anything is not running and ready."""

    def once() -> int:
        import json
        from dataclasses import asdict

        from rich.console import Console
        from rich.table import Table

        from primectl.deploy.observe import collect_status

        with connected(recipe, accept_new_host_keys) as (_, p, cluster):
            rows, gate = collect_status(cluster)
        healthy = all(r.healthy for r in rows) and bool(gate.get("ok"))
        if output is Output.json:
            doc = {"deployment": p.name, "healthy": healthy, "gate": gate,
                   "services": [asdict(r) | {"healthy": r.healthy} for r in rows]}
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        else:
            t = Table(title=f"{p.name}: {'healthy' if healthy else 'NOT HEALTHY'}")
            for col in ("service", "host", "role", "running", "ready", "pid", "revision", "detail"):
                t.add_column(col, no_wrap=col != "detail", overflow="fold")
            for r in rows:
                t.add_row(r.service, r.host, r.role, "yes" if r.running else "NO", "yes" if r.ready else "NO",
                          str(r.pid or "-"), r.revision or "-", r.detail)
            Console().print(t)
            Console().print(f"gate {p.gate.url}: {'ready' if gate.get('ok') else 'NOT READY'} ({gate.get('detail')})")
        return 0 if healthy else EXIT_FAILURE

    def body() -> int:
        import time

        while True:
            code = once()
            if not watch:
                return code
            time.sleep(watch)

    raise typer.Exit(_guard(body))


@app.command()
def logs(
    recipe: RecipeArg,
    service: Annotated[str, typer.Argument(help="Service name, e.g. decode-3 (see `primectl plan`).")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines.")] = False,
    tail: Annotated[int, typer.Option("--tail", help="Lines to show first.")] = 100,
    accept_new_host_keys: AcceptKeysOpt = False,
) -> None:
    """Print a service's log from its host."""

    def body() -> int:
        from primectl.deploy.observe import log_command
        from primectl.deploy.transport import connect
        from primectl.recipe.load import did_you_mean

        loaded, p = load_plan(recipe)
        names = [s.name for s in p.services]
        if service not in names:
            from primectl.errors import Problem

            raise RecipeError([Problem(str(recipe), 0, 0, "service",
                                       f"no service {service!r}{did_you_mean(service, names)}; services: {', '.join(names)}")])
        host, command = log_command(p, service, follow=follow, lines=tail)
        t = connect(p.host(host), known_hosts=loaded.recipe.known_hosts, accept_new_host_keys=accept_new_host_keys)
        try:
            code, _, _ = t.run(command, stream=True)
        finally:
            t.close()
        return 0 if code == 0 else EXIT_FAILURE

    raise typer.Exit(_guard(body))


@app.command()
def unlock(recipe: RecipeArg, accept_new_host_keys: AcceptKeysOpt = False) -> None:
    """Break the cluster lock left by an interrupted run."""

    def body() -> None:
        with connected(recipe, accept_new_host_keys, head_only=True) as (_, p, cluster):
            head = p.service("frontend").host
            cluster.call(head, "unlock", {"force": True})
        _say(f"lock of {p.name} on {head} removed")

    _guard(body)


@app.command()
def provision(
    recipe: RecipeArg,
    wheelhouse: Annotated[Path | None, typer.Option("--wheelhouse", help="Push these wheels and install offline.")] = None,
    accept_new_host_keys: AcceptKeysOpt = False,
) -> None:
    """Install (or reuse) the pinned host runtime on every host; `up` does this first."""

    def body() -> None:
        from primectl.deploy.provision import provision as do_provision

        with connected(recipe, accept_new_host_keys) as (_, _, cluster):
            do_provision(cluster, wheelhouse=wheelhouse, say=_say)

    _guard(body)


@app.command()
def doctor(recipe: RecipeArg, accept_new_host_keys: AcceptKeysOpt = False) -> None:
    """Installed runtime versions per host against the recipe's pins; exit 1 on drift."""

    def body() -> int:
        from primectl.deploy.provision import drift, installed_packages, venv_path

        bad = 0
        with connected(recipe, accept_new_host_keys) as (loaded, p, cluster):
            own_python = loaded.recipe.software.python
            for h in sorted(cluster.transports):
                venv = own_python or venv_path(p, h)
                freeze = installed_packages(cluster, h, venv, python=own_python)
                if not freeze:
                    typer.echo(f"{h}: no runtime at {venv} (run `primectl provision`)")
                    bad += 1
                    continue
                d = drift(p, freeze)
                for name, (pin, have) in sorted(d.items()):
                    typer.echo(f"{h}: {name} pinned {pin}, installed {have or 'missing'}")
                if not d:
                    typer.echo(f"{h}: ok ({len(p.pins)} pins match)")
                bad += bool(d)
        return EXIT_FAILURE if bad else 0

    raise typer.Exit(_guard(body))


@app.command()
def smoke(
    recipe: Annotated[Path | None, typer.Argument(help="Recipe YAML file (optional with --url).", show_default=False)] = None,
    url: Annotated[str | None, typer.Option("--url", help="Endpoint base URL, e.g. http://host:8000 (default: the recipe's).")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Served model name (default: the recipe's).")] = None,
    output: OutputOpt = Output.table,
    junit: Annotated[Path | None, typer.Option("--junit", help="Also write a JUnit XML report here.")] = None,
) -> None:
    """Endpoint smoke tests (readiness, chat, streaming, disaggregation, errors, tools); exit 1 on any failure."""

    def body() -> int:


        from primectl.checks.smoke import print_report, run_smoke

        p = None
        if recipe is not None:
            _, p = load_plan(recipe)
        elif url is None:
            raise typer.BadParameter("give a RECIPE or --url (with --model)", param_hint="RECIPE")
        if p is None and not model:
            raise typer.BadParameter("--model is required with --url and no recipe", param_hint="--model")
        report = run_smoke(url or (p.endpoint if p else ""), model or (p.served_model if p else ""), p,
                           p.engine if p else None)
        if junit is not None:
            junit.write_text(report.to_junit(), encoding="utf-8")
        return _emit_report(report, output, print_report)

    raise typer.Exit(_guard(body))


@app.command()
def preflight(
    recipe: RecipeArg,
    output: OutputOpt = Output.table,
    accept_new_host_keys: AcceptKeysOpt = False,
    no_selftest: Annotated[bool, typer.Option("--no-selftest", help="Skip the kernel self-test on GPU hosts.")] = False,
    no_fabric: Annotated[bool, typer.Option("--no-fabric", help="Skip the NIXL and Mooncake transfer probes.")] = False,
) -> None:
    """Host checks before a launch (SSH, disk, ports, clock, versions, GPUs, NIXL, Mooncake); exit 1 on any fail."""

    def body() -> int:


        from primectl.checks.preflight import print_report, run_preflight

        loaded, p = load_plan(recipe)
        report = run_preflight(p, loaded.recipe, known_hosts=loaded.recipe.known_hosts,
                               accept_new_host_keys=accept_new_host_keys, say=_say,
                               selftest=not no_selftest, fabric=not no_fabric)
        return _emit_report(report, output, print_report)

    raise typer.Exit(_guard(body))


@app.command()
def bench(
    recipe: RecipeArg,
    workload: Annotated[str | None, typer.Option(
        "--workload", help="agentic or agentic-demo (default: agentic-demo for engine mocker, else agentic).")] = None,
    duration: Annotated[float, typer.Option("--duration", help="Seconds of load per AIPerf run.")] = 60.0,
    concurrency: Annotated[int, typer.Option(
        "--concurrency", min=1, help="Concurrent sessions (with --sla: the top of the search range).")] = 8,
    sla: Annotated[str | None, typer.Option(
        "--sla", help="Find the most concurrent sessions meeting it, e.g. 'tok_s_per_user>=100', 'ttft_p90_ms<=2000'.")] = None,
    max_runs: Annotated[int, typer.Option("--max-runs", min=1, max=7, help="AIPerf runs the --sla search may use.")] = 7,
    trace: Annotated[Path | None, typer.Option("--trace", help="Replay this AIPerf mooncake_trace JSONL instead.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Workload and AIPerf seed.")] = 20260,
    sessions: Annotated[int | None, typer.Option("--sessions", help="Sessions to generate (default: per preset x concurrency).")] = None,
    max_error_rate: Annotated[float, typer.Option("--max-error-rate", help="Above this error fraction a run is INVALID.")] = 0.01,
    tokenizer: Annotated[str | None, typer.Option("--tokenizer", help="Tokenizer dir or HF id (default: the recipe's model).")] = None,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories go.")] = Path("runs"),
    output: OutputOpt = Output.table,
) -> None:
    """Agentic benchmark with AIPerf against a running deployment; exit 1 if the run is INVALID."""

    def body() -> int:
        import json

        from primectl.bench.aiperf import AIPerfMissing
        from primectl.bench.runner import BenchOptions, run_bench, run_knee
        from primectl.bench.sla import parse_sla

        try:
            opts = BenchOptions(workload=workload, duration_s=duration, concurrency=concurrency, trace=trace, seed=seed,
                                sessions=sessions, max_error_rate=max_error_rate, tokenizer=tokenizer)
            if sla is None:
                res = run_bench(recipe, opts, runs_root=runs_dir, say=_say)
            else:
                knee = run_knee(recipe, opts, parse_sla(sla), max_runs=max_runs, runs_root=runs_dir, say=_say)
        except (AIPerfMissing, ValueError) as exc:
            _say(f"error: {exc}")
            return EXIT_BAD_INPUT
        if sla is None:
            s = res.summary
            if output is Output.json:
                sys.stdout.write(json.dumps(s, indent=2, default=str) + "\n")
            else:
                f = s["figures"]
                typer.echo(f"{s['status']}: {res.run_dir}")
                for r in s["invalid_reasons"]:
                    typer.echo(f"  INVALID: {r}")
                if s["valid"]:
                    for k in ("tok_s_per_user", "e2e_tok_s_per_user", "output_tok_s_per_gpu", "ttft_p50_ms", "ttft_p90_ms",
                              "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "request_throughput_rps",
                              "prefix_cache_hit_rate", "error_rate"):
                        typer.echo(f"  {k:22} {f.get(k) if f.get(k) is None else round(f[k], 4)}")
                    typer.echo(f"  gpu count              {s['gpu']['count']} ({s['gpu']['basis']})")
                for w in s.get("warnings", []):
                    typer.echo(f"  warning: {w}")
            return 0 if s["valid"] else EXIT_FAILURE
        rep = knee.report
        if output is Output.json:
            sys.stdout.write(json.dumps(rep, indent=2, default=str) + "\n")
        else:
            typer.echo(f"SLA {rep['sla']}: knee = {rep['knee'] if rep['knee'] is not None else 'none'} "
                       f"({rep['runs']} runs, {'resolved' if rep['resolved'] else 'not resolved to one step'}): "
                       f"{knee.run_dir}")
        return 0 if knee.result.knee is not None else EXIT_FAILURE

    raise typer.Exit(_guard(body))


@app.command()
def ab(
    a: Annotated[Path, typer.Argument(help="Recipe A.", show_default=False)],
    b: Annotated[Path, typer.Argument(help="Recipe B (same hosts as A).", show_default=False)],
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Interleaved A,B rounds (>= 2 gives the spread).")] = 1,
    duration: Annotated[float, typer.Option("--duration", help="Seconds of load per run.")] = 60.0,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Concurrent sessions.")] = 8,
    workload: Annotated[str | None, typer.Option("--workload", help="agentic or agentic-demo (default: A's engine's).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Workload and AIPerf seed (the same for A and B).")] = 20260,
    max_error_rate: Annotated[float, typer.Option("--max-error-rate", help="Above this error fraction a run is INVALID.")] = 0.01,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where run directories go.")] = Path("runs"),
) -> None:
    """Paired A/B trial: deploy A, bench, deploy B, bench (x --repeat), then report.md with deltas vs spread."""

    def body() -> int:
        from primectl.bench.aiperf import AIPerfMissing
        from primectl.bench.runner import BenchOptions, run_ab

        try:
            opts = BenchOptions(workload=workload, duration_s=duration, concurrency=concurrency, seed=seed,
                                max_error_rate=max_error_rate)
            res = run_ab(a, b, opts, repeat=repeat, runs_root=runs_dir, say=_say)
        except (AIPerfMissing, ValueError) as exc:
            _say(f"error: {exc}")
            return EXIT_BAD_INPUT
        typer.echo(f"report: {res.run_dir / 'report.md'}")
        for r in res.rows:
            typer.echo(f"  {r['metric']:22} delta {r['delta'] if r['delta'] is None else round(r['delta'], 4)}"
                       f"  significant: {r['significant']}")
        bad = [f"{lab}{i}" for lab, i, r in res.runs if not r.valid]
        if bad:
            typer.echo(f"INVALID runs (left out of the statistics): {', '.join(bad)}")
        return 0 if res.valid else EXIT_FAILURE

    raise typer.Exit(_guard(body))


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
