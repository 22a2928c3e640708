"""`target: slurm` without a cluster: the planned node slots, the job's shape and sbatch script, binding, the waiter.

The glm53 job (`primectl render recipes/glm53.yaml --target slurm`) is pinned byte for byte under
tests/golden/glm53-slurm/; after an intended change:

    PRIMECTL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_slurm_job.py

The job itself runs on the real Slurm test cluster in tests/integration/test_slurm_target.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from primectl.errors import DeployError
from primectl.host import slurm_wait
from primectl.plan.model import NODE_MARKER_RE, Plan
from primectl.planner.build import build_plan, plan_recipe
from primectl.planner.load import load_recipe
from primectl.targets.slurm import SlurmTarget
from primectl.targets.slurm_files import bind
from primectl.targets.slurm_job import components, directives, job_hash, render_release
from primectl.targets.slurm_monitoring import job_plan
from primectl.targets.slurm_recipe import Slurm

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden" / "glm53-slurm"
UPDATE = os.environ.get("PRIMECTL_UPDATE_GOLDEN") == "1"
NOT_STORED = ("plan.json",)  # the whole plan, pinned by the plan tests; it rides along for rollbacks


def slurm_plan(recipe: str = "glm53.yaml", **slurm: Any) -> Plan:
    """The recipe planned for target slurm, with `slurm` options on top."""
    r = load_recipe(REPO / "recipes" / recipe).recipe
    update: dict[str, Any] = {"target": "slurm"}
    if slurm:
        block = getattr(r, "slurm", None)  # a recipe without a `slurm:` key has no such field
        base = block.model_dump() if block else {}
        update["slurm"] = Slurm.model_validate(base | slurm)
    return build_plan(r.model_copy(update=update))


def test_cli_render_target_slurm_writes_the_golden_job(cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("render", "recipes/glm53.yaml", "--target", "slurm", "--out", tmp_path)
    assert result.exit_code == 0, result.stderr
    written = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    Plan.model_validate_json(written.pop("plan.json"))
    if UPDATE:
        shutil.rmtree(GOLDEN, ignore_errors=True)
        for rel, data in written.items():
            (GOLDEN / rel).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / rel).write_bytes(data)
    want = {p.relative_to(GOLDEN).as_posix(): p.read_bytes() for p in GOLDEN.rglob("*") if p.is_file()}
    assert sorted(written) == sorted(want), "a file was added or removed (PRIMECTL_UPDATE_GOLDEN=1 after review)"
    changed = [p for p in sorted(want) if written[p] != want[p]]
    assert not changed, f"rendered job differs from tests/golden/glm53-slurm: {changed[:10]}"
    assert os.access(tmp_path / "job.sbatch", os.X_OK) and os.access(tmp_path / "bin" / "primectl-wait", os.X_OK)


def test_glm53_is_one_het_job_head_then_three_prefill_pairs_then_twelve_single_trays() -> None:
    plan = slurm_plan()
    comps = components(job_plan(plan))  # monitoring runs outside the job (tests/test_slurm_monitoring.py)
    assert [(c.kind, len(c.hosts), c.gpus_per_node, c.one_domain) for c in comps] == (
        [("head", 1, 0, False)] + [("prefill", 2, 4, True)] * 3 + [("decode", 1, 4, False)] * 12)
    assert comps[0].services == ["etcd", "mooncake-master", "frontend"]
    assert comps[1].hosts == ["tray01", "tray02"] and comps[1].services == ["prefill-0-0", "prefill-0-1"]
    script = render_release(plan).files["job.sbatch"].decode()
    assert script.count("#SBATCH hetjob") == 15
    assert script.count("--segment=2") == 3 and script.count("--gpus-per-node=4") == 15
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert header[:3] == ["#SBATCH --job-name=primectl-glm53", "#SBATCH --output=/var/lib/primectl/slurm/glm53/jobs/%j.out",
                          "#SBATCH --nodes=1 --ntasks-per-node=1 --exclusive --mem=0"]
    assert "#SBATCH --nodes=2 --ntasks-per-node=1 --exclusive --mem=0 --gpus-per-node=4 --segment=2" in header
    assert "Slurm 24.05+ with TopologyPlugin=topology/block" in script


def test_nvlink_switches_gres_and_every_option_land_on_the_right_components() -> None:
    plan = slurm_plan(nvlink="switches", switches_wait="0:30", gpu_request="gres", partition="gb200", account="llm",
                      time_limit="7-00:00:00", exclusive=False, extra_sbatch=["--qos=serving"],
                      component_sbatch={"head": ["--constraint=cpu"], "decode": ["--reservation=decode"]})
    lines = {c.kind: directives(plan, c) for c in components(job_plan(plan))}
    assert lines["head"] == ["--nodes=1 --ntasks-per-node=1 --partition=gb200 --account=llm --time=7-00:00:00",
                             "--qos=serving", "--constraint=cpu"]
    assert lines["prefill"] == ["--nodes=2 --ntasks-per-node=1 --partition=gb200 --account=llm --time=7-00:00:00 "
                                "--gres=gpu:4 --switches=1@0:30", "--qos=serving"]
    assert lines["decode"] == ["--nodes=1 --ntasks-per-node=1 --partition=gb200 --account=llm --time=7-00:00:00 "
                               "--gres=gpu:4", "--qos=serving", "--reservation=decode"]
    assert "Slurm 24.05+" not in render_release(plan).files["job.sbatch"].decode()


def test_slurm_hosts_are_node_slots_bound_at_run_time() -> None:
    plan = slurm_plan("demo-slurm.yaml")
    assert {h.name: h.address for h in plan.hosts} == {"h1": "@node:h1@", "h2": "@node:h2@", "h3": "@node:h3@"}
    assert plan.host("h2").workdir == "/tmp/primectl-demo-slurm/demo-slurm/jobs/@job@/h2"
    assert plan.endpoint == "http://@node:h1@:8000"
    # One shared runtime for every node (demo-slurm provisions one: software.python is not set).
    pythons = {r.python for r in plan.serving.runtime.values()}
    assert pythons == {f"/tmp/primectl-demo-slurm/runtime/{plan.runtime_key}/bin/python"}
    assert plan.service("etcd").argv[plan.service("etcd").argv.index("--data-dir") + 1] == (
        "/tmp/primectl-demo-slurm/demo-slurm/jobs/@job@/h1/data/etcd")
    # The SSH recipe it extends still plans its real hosts.
    ssh = plan_recipe(REPO / "recipes" / "demo-multihost.yaml")[1]
    assert [h.address for h in ssh.hosts] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert ssh.target.kind == "ssh" and ssh.target.options == {"known_hosts": ".demo/ssh/known_hosts"}  # its own


def test_bind_puts_the_jobs_addresses_everywhere_the_plan_had_markers() -> None:
    plan = slurm_plan("demo-slurm.yaml")
    hosts = {"h1": {"node": "n1", "address": "10.0.0.1"}, "h2": {"node": "n2", "address": "10.0.0.2"},
             "h3": {"node": "n3", "address": "10.0.0.3"}}
    bound = bind(plan, "42", hosts)
    text = bound.model_dump_json()
    assert not NODE_MARKER_RE.search(text) and "@job@" not in text
    assert bound.endpoint == "http://10.0.0.1:8000"
    assert bound.service("decode-1").env["DYN_SYSTEM_HOST"] == "10.0.0.3"
    assert bound.service("decode-1").env["ETCD_ENDPOINTS"] == "http://10.0.0.1:2379"
    assert bound.host("h2").workdir.endswith("/jobs/42/h2")
    with pytest.raises(DeployError, match="did not bind logical host"):
        bind(plan, "42", {k: v for k, v in hosts.items() if k != "h3"})
    with pytest.raises(DeployError, match="unusable addresses"):
        bind(plan, "42", hosts | {"h1": {"node": "n1", "address": "10.0.0.1; rm -rf /"}})


def test_release_revision_follows_the_job_not_how_long_up_waits() -> None:
    base = render_release(slurm_plan("demo-slurm.yaml"))
    again = render_release(slurm_plan("demo-slurm.yaml"))
    assert base.files == again.files and base.revision == again.revision
    patient = slurm_plan("demo-slurm.yaml", pending_timeout_s=3600)
    assert render_release(patient).revision == base.revision and job_hash(patient) == base.manifest["job_hash"]
    moved = slurm_plan("demo-slurm.yaml", partition="other")
    assert render_release(moved).revision != base.revision and job_hash(moved) != base.manifest["job_hash"]


def test_job_scripts_are_valid_bash(tmp_path: Path) -> None:
    for plan in (slurm_plan(), slurm_plan("demo-slurm.yaml"), slurm_plan("demo.yaml"),
                 slurm_plan("glm53.yaml", interface="ib0", srun_args=["--container-image=nvcr.io/x/y:1"])):
        script = tmp_path / "job.sbatch"
        script.write_bytes(render_release(plan).files["job.sbatch"])
        r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert r.returncode == 0, f"{plan.name}: {r.stderr}"
    single = render_release(slurm_plan("demo.yaml")).files["job.sbatch"].decode()
    assert "hetjob" not in single and "--het-group" not in single and "SLURM_JOB_NODELIST" in single


def test_render_refuses_an_unknown_target(cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("render", "recipes/glm53.yaml", "--target", "slrum", "--out", tmp_path)
    assert result.exit_code == 2 and "'slrum' is not a target (did you mean `slurm`?)" in result.stderr


def test_host_commands_refuse_a_slurm_recipe(cli: Callable[..., Any]) -> None:
    for args in (["preflight"], ["provision"], ["doctor"], ["drain", "decode-0"], ["restart", "decode-0"]):
        result = cli(args[0], "recipes/demo-slurm.yaml", *args[1:])
        assert result.exit_code == 1, (args, result.stderr)
        assert f"`primectl {args[0]}` runs on targets that reach each host themselves; target slurm checks and " \
               "provisions in `primectl up`" in " ".join(result.stderr.split()), (args, result.stderr)


def test_logs_journal_on_a_slurm_recipe_says_the_step_output_is_the_log(cli: Callable[..., Any], tmp_path: Path) -> None:
    recipe = tmp_path / "slurm-systemd.yaml"  # supervisor: systemd passes the CLI's check; the target refuses
    recipe.write_text(f"extends: {REPO / 'recipes' / 'demo-slurm.yaml'}\nsupervisor: systemd\n")
    result = cli("logs", recipe, "frontend", "--journal")
    assert result.exit_code == 1, result.stderr
    assert "on the slurm target services are job steps" in " ".join(result.stderr.split())


def test_target_render_is_the_release_plus_its_plan() -> None:
    plan = slurm_plan("demo-slurm.yaml")
    files = SlurmTarget().render(plan)
    assert Plan.model_validate_json(files["plan.json"]) == plan
    assert set(files) - {"plan.json"} == set(render_release(plan).files)


# -- the waiter the job runs between waves ------------------------------------------------------------

def _job_dir(tmp_path: Path, probes: dict[str, dict[str, Any]], pids: dict[str, int]) -> Path:
    job = tmp_path / "job"
    (job / "release" / "ready").mkdir(parents=True)
    for name, probe in probes.items():
        (job / "release" / "ready" / f"{name}.json").write_text(json.dumps(probe))
    (job / "pids").write_text("".join(f"{n} {p}\n" for n, p in pids.items()))
    return job


def _command(argv: list[str], timeout: float = 5) -> dict[str, Any]:
    return {"kind": "command", "command": argv, "timeout_s": timeout, "interval_s": 0.1}


def test_waiter_passes_once_every_probe_passes_and_notes_each(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    job = _job_dir(tmp_path, {"a": _command(["true"]), "b": _command(["test", "-e", str(flag)])}, {"a": os.getpid()})
    flag.touch()
    assert slurm_wait.wait(str(job), ["a", "b"]) == 0
    events = (job / "events").read_text().splitlines()
    assert sorted(line.split()[2] for line in events) == ["a", "b"] and all(" ready " in line for line in events)


def test_waiter_names_a_service_that_ended_and_one_that_never_got_ready(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    job = _job_dir(tmp_path, {"a": _command(["false"])}, {"gone": done.pid})
    assert slurm_wait.wait(str(job), ["a"]) == 3
    assert capsys.readouterr().out.strip() == "gone"
    (job / "pids").write_text("")
    job2 = _job_dir(tmp_path / "2", {"a": _command(["sh", "-c", "echo warming up >&2; exit 1"], timeout=0.3)}, {})
    assert slurm_wait.wait(str(job2), ["a"]) == 4
    assert "timeout a not ready after 0.3s (exit 1: warming up)" in (job2 / "events").read_text()


def test_waiter_stops_waiting_when_primectl_stops_the_job(tmp_path: Path) -> None:
    job = _job_dir(tmp_path, {"a": _command(["false"])}, {})
    (job / "stopping").touch()
    assert slurm_wait.wait(str(job), ["a"]) == 5
