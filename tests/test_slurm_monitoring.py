"""A monitored recipe on Slurm: exporters as node daemons, Prometheus on the head, the job's targets as file_sd.

Rendered for recipes/glm53.yaml (monitoring on, as a production rack has it). The job script's binding
and publishing run for real, with a fake of Slurm (`scontrol` answering node names and addresses, `srun` that
starts nothing); the head's prometheus.yml is checked by promtool and read by the real Prometheus, which must
find the targets the job published. The job on the real Slurm test cluster is
tests/integration/test_slurm_monitoring.py.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from primectl.monitoring import dcgm
from primectl.plan.model import Plan
from primectl.planner.build import plan_recipe
from primectl.render.bundle import render_host
from primectl.targets import slurm_monitoring
from primectl.targets.slurm import SlurmTarget
from primectl.targets.slurm_job import components, deploy_dir
from tests.exposition import Gate, free_port, prometheus_targets

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "glm53.yaml"
PROMETHEUS, PROMTOOL = "/usr/bin/prometheus", "/usr/bin/promtool"
MONITORING = ("node-exporter", "dcgm-exporter", "health-check", "prometheus", "alertmanager")


def slurm_plan(tmp_path: Path) -> Plan:
    """The monitored glm53 for target slurm, its job_dir under tmp_path."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"extends: {RECIPE}\nslurm:\n  job_dir: {tmp_path / 'jobs'}\n")
    return plan_recipe(recipe, target="slurm")[1]


@pytest.fixture
def plan(tmp_path: Path) -> Plan:
    return slurm_plan(tmp_path)


@pytest.fixture
def release(plan: Plan) -> dict[str, bytes]:
    return SlurmTarget().render(plan)


def exec_start(unit: bytes) -> list[str]:
    line = next(x for x in unit.decode().splitlines() if x.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def test_no_monitoring_service_is_a_job_step(plan: Plan, release: dict[str, bytes]) -> None:
    script = release["job.sbatch"].decode()
    started = [line.split()[1] for line in script.splitlines() if line.startswith("start ")]
    job = Plan.model_validate_json(release["plan.json"])
    assert sorted(started) == sorted(s.name for s in job.services)
    assert not [s.name for s in job.services if s.component in MONITORING]
    assert [s for s in plan.services if s.component in MONITORING], "the recipe monitors"
    assert not [p for p in release if p.startswith(("bin/node-exporter", "bin/prometheus", "bin/health"))]
    assert all(c.services == [s for s in c.services if not s.startswith(("node-exporter", "dcgm"))]
               for c in components(job))
    # Prometheus and Alertmanager answer on the machine primectl runs on, not on a node of the job
    assert job.monitoring is not None and job.monitoring.prometheus_url == "http://127.0.0.1:9090"


def test_an_unmonitored_plan_is_its_own_job_plan(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"extends: {REPO / 'recipes' / 'glm53.yaml'}\nmonitoring: {{enabled: false}}\n")
    plan = plan_recipe(recipe, target="slurm")[1]
    assert slurm_monitoring.job_plan(plan) is plan
    assert not [p for p in SlurmTarget().render(plan) if p.startswith("monitoring/")]


def test_exporters_are_node_units_watching_every_node_between_jobs(release: dict[str, bytes]) -> None:
    node = exec_start(release["monitoring/node/primectl-node-exporter.service"])
    assert node[0] == "/usr/bin/prometheus-node-exporter"
    assert "--web.listen-address=:9100" in node and "--collector.infiniband" in node
    assert not [a for a in node if "@" in a]  # nothing of one job's
    # the node's health loop writes where the node's node_exporter reads
    assert f"--collector.textfile.directory={slurm_monitoring.NODE_TEXTFILES}" in node
    gpu = exec_start(release["monitoring/node/primectl-dcgm-exporter.service"])
    opts = dict(zip(gpu[1::2], gpu[2::2], strict=True))
    assert gpu[0] == "/usr/bin/dcgm-exporter" and opts == {"-f": slurm_monitoring.NODE_COUNTERS, "-c": "5000", "-a": ":9400"}
    assert release["monitoring/node/dcgm-counters.csv"].decode() == dcgm.counters_csv()
    assert "Restart=always" in release["monitoring/node/primectl-node-exporter.service"].decode()
    readme = release["monitoring/README.txt"].decode()
    # one loop per node: the GPU one on GPU nodes, the other elsewhere
    assert "systemctl enable --now primectl-node-exporter primectl-health      (nodes without GPUs)" in readme
    assert ("systemctl enable --now primectl-node-exporter primectl-dcgm-exporter primectl-health-gpu      (GPU nodes)"
            in readme)
    assert f"install -D -m 644 -t {slurm_monitoring.NODE_HEALTH} node/health/*.py" in readme


def test_the_health_loops_are_node_units_with_the_gpu_checks_on_gpu_nodes(plan: Plan, release: dict[str, bytes]) -> None:
    """The trays' loop checks their 4 GB200s, NVLink and InfiniBand; the CPU head's only disk and memory. Both read
    the gate from the file the running job publishes, not from a planned address."""
    gpu, cpu = (exec_start(release[f"monitoring/node/{n}.service"]) for n in ("primectl-health-gpu", "primectl-health"))
    for argv in (gpu, cpu):
        opts = dict(zip(argv[2::2], argv[3::2], strict=False))
        assert argv[:2] == [slurm_monitoring.NODE_PYTHON, f"{slurm_monitoring.NODE_HEALTH}/health_loop.py"]
        assert opts["--textfile-dir"] == slurm_monitoring.NODE_TEXTFILES and opts["--host"] == "%H"
        assert argv[-2:] == ["--gate-file", f"{slurm_monitoring.sd_dir(deploy_dir(plan))}/gate.*.url"]
        assert "--gate" not in argv and not [a for a in argv if "@" in a]
    assert gpu[gpu.index("--gpus") + 1] == "4" and gpu[gpu.index("--gpu-name") + 1] == "NVIDIA GB200"
    unit = release["monitoring/node/primectl-health-gpu.service"].decode()
    assert '--gpu-name "NVIDIA GB200"' in unit  # quoted for systemd
    assert f"RequiresMountsFor={deploy_dir(plan)}" in unit  # the shared filesystem: the gate file, the disk checked
    assert "--nvlink-expected" in gpu and "--gpus" not in cpu
    assert {p.removeprefix("monitoring/node/health/") for p in release if p.startswith("monitoring/node/health/")} == {
        "health_loop.py", "preflight_host.py", "host_rules.py"}
    assert release[slurm_monitoring.GATE].decode() == f"http://@node:head@:8000/v1/models/{plan.served_model}/ready\n"


def head_dir(release: dict[str, bytes], into: Path) -> Path:
    """monitoring/head/ of the release, installed in `into` as the README says."""
    into.mkdir(parents=True, exist_ok=True)
    for rel, data in release.items():
        if rel.startswith("monitoring/head/"):
            (into / rel.removeprefix("monitoring/head/")).write_bytes(data)
    return into


@pytest.mark.skipif(not os.path.exists(PROMTOOL), reason=f"{PROMTOOL} is not installed")
def test_the_heads_prometheus_reads_the_jobs_file_sd_and_the_bare_metal_rules(
        plan: Plan, release: dict[str, bytes], tmp_path: Path) -> None:
    head = head_dir(release, tmp_path / "etc")
    checked = subprocess.run([PROMTOOL, "check", "config", str(head / "prometheus.yml")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = yaml.safe_load((head / "prometheus.yml").read_text())
    sd = slurm_monitoring.sd_dir(deploy_dir(plan))
    file_sd = {j["job_name"]: j["file_sd_configs"][0]["files"] for j in config["scrape_configs"] if "file_sd_configs" in j}
    assert file_sd == {name: [f"{sd}/{name}.*.json"] for name in
                       ("etcd", "mooncake-master", "dynamo-vllm", "dynamo-frontend", "node-exporter", "dcgm-exporter")}
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["localhost:9093"]
    ssh_plan = plan_recipe(RECIPE, target="ssh")[1]
    bare = render_host(ssh_plan, ssh_plan.host(ssh_plan.service("prometheus").host)).files["config/primectl.rules.yml"]
    assert (head / "primectl.rules.yml").read_bytes() == bare
    units = {p: exec_start(d) for p, d in release.items() if p.startswith("monitoring/head/") and p.endswith(".service")}
    prom = units["monitoring/head/primectl-glm53-prometheus.service"]
    assert f"--config.file={slurm_monitoring.head_dir(plan)}/prometheus.yml" in prom and "--web.listen-address=:9090" in prom


# -- the job's binding and publishing, run for real ------------------------------------------------------------

FAKE_SCONTROL = """#!/bin/bash
# A fake of Slurm's scontrol: node names as given, each node's address from FAKE_ADDRESSES (name=address ...).
if [[ $1 == show && $2 == hostnames ]]; then tr ',' '\\n' <<< "$3"; exit 0; fi
if [[ $1 == show && $2 == node ]]; then
  for kv in $FAKE_ADDRESSES; do [[ ${kv%%=*} == "$4" ]] && echo "NodeName=$4 NodeAddr=${kv#*=} State=ALLOCATED"; done
  exit 0
fi
exit 1
"""
FAKE_SRUN = """#!/bin/bash
# A fake of Slurm's srun: starts nothing; each step waits (60 s at most) until the job has published its targets,
# copies what is there, then "ends". The first whole copy becomes the snapshot: a step ends only after its own copy,
# and the job removes what it published only once a step has ended.
for _ in $(seq 600); do grep -qs "published scrape targets" "$FAKE_EVENTS" && break; sleep 0.1; done
copy="$FAKE_SNAPSHOT.$$"
mkdir "$copy" && cp "$FAKE_SD_DIR"/*.json "$FAKE_SD_DIR"/gate.*.url "$copy"/ && mv -T "$copy" "$FAKE_SNAPSHOT" 2>/dev/null
rm -rf "$copy"
exit 1
"""
FAKE_PYTHON3 = """#!/bin/bash
# A fake of the nodes' python3 for one program: primectl-wait says every service of a wave is ready (the fake steps
# run nothing); anything else runs the real python3.
[[ ${1:-} == */bin/primectl-wait ]] && exit 0
exec /usr/bin/python3 "$@"
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run_job_with_fake_slurm(plan: Plan, release: dict[str, bytes], tmp_path: Path) -> tuple[Path, dict[str, str], str]:
    """Run job.sbatch as job 4242 on fake nodes whose services are ready at once; the published files as the
    first job step saw them, each logical host's address, the events."""
    rel = tmp_path / "release"
    for path, data in release.items():
        (rel / path).parent.mkdir(parents=True, exist_ok=True)
        (rel / path).write_bytes(data)
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    _executable(fake / "scontrol", FAKE_SCONTROL)
    _executable(fake / "srun", FAKE_SRUN)
    _executable(fake / "python3", FAKE_PYTHON3)
    comps = components(Plan.model_validate_json(release["plan.json"]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    addresses: dict[str, str] = {}
    for c in comps:
        names = [f"gb{len(addresses) + i:03d}" for i in range(len(c.hosts))]
        env[f"SLURM_JOB_NODELIST_HET_GROUP_{c.index}"] = ",".join(names)
        for i, (host, name) in enumerate(zip(c.hosts, names, strict=True)):
            addresses[host] = f"10.9.{c.index}.{i + 1}"
            env["FAKE_ADDRESSES"] = env.get("FAKE_ADDRESSES", "") + f" {name}={addresses[host]}"
    sd = slurm_monitoring.sd_dir(deploy_dir(plan))
    Path(sd).mkdir(parents=True)
    (Path(sd) / "dynamo-vllm.4100.json").write_text("[]")  # left by a job that was killed
    (Path(sd) / "gate.4100.url").write_text("http://10.0.0.1:8000/v1/models/gone/ready\n")
    env |= {"PATH": f"{fake}:{env['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_SUBMIT_DIR": str(rel),
            "FAKE_SD_DIR": sd, "FAKE_SNAPSHOT": str(tmp_path / "published"),
            "FAKE_EVENTS": str(Path(deploy_dir(plan)) / "jobs" / "4242" / "events")}
    done = subprocess.run(["bash", str(rel / "job.sbatch")], env=env, capture_output=True, text=True, timeout=120)
    events = (Path(deploy_dir(plan)) / "jobs" / "4242" / "events").read_text()
    assert done.returncode != 0 and "exited " in events, done.stdout + done.stderr  # the fake steps end at once
    # published once the job serves, not while its workers load (they would page as down)
    assert events.index("published scrape targets") < events.index("serving") < events.index("exited "), events
    assert events.rindex("start ") < events.index("published scrape targets"), events
    return tmp_path / "published", addresses, events


def test_the_job_publishes_its_bound_targets_and_removes_them_when_it_ends(
        plan: Plan, release: dict[str, bytes], tmp_path: Path) -> None:
    published, addresses, _ = run_job_with_fake_slurm(plan, release, tmp_path)
    files = sorted(p.name for p in published.iterdir())
    assert files == sorted([f"{j}.4242.json" for j in ("dcgm-exporter", "dynamo-frontend", "dynamo-vllm", "etcd",
                                                         "mooncake-master", "node-exporter")] + ["gate.4242.url"])
    # the readiness gate, bound to the node the frontend runs on, for the nodes' health loops
    gate = (published / "gate.4242.url").read_text().strip()
    assert gate == f"http://{addresses['head']}:8000/v1/models/{plan.served_model}/ready"
    groups: list[dict[str, Any]] = json.loads((published / "node-exporter.4242.json").read_text())
    assert {g["labels"]["host"]: g["targets"] for g in groups} == {h: [f"{a}:9100"] for h, a in addresses.items()}
    assert {tuple(sorted(g["labels"])) for g in groups} == {("deployment", "host", "role", "service")}
    gpu = json.loads((published / "dcgm-exporter.4242.json").read_text())
    assert sorted(g["labels"]["host"] for g in gpu) == sorted(h for h in addresses if h != "head")
    assert not [p for p in published.iterdir() if "@node:" in p.read_text() or "@job@" in p.read_text()]
    # the EXIT trap took them away again, and the earlier job's leftover went when this one published
    assert list(Path(slurm_monitoring.sd_dir(deploy_dir(plan))).iterdir()) == []



@pytest.mark.skipif(not os.path.exists(PROMETHEUS), reason=f"{PROMETHEUS} is not installed")
def test_prometheus_on_the_head_finds_what_the_job_published(plan: Plan, release: dict[str, bytes], tmp_path: Path) -> None:
    published, addresses, _ = run_job_with_fake_slurm(plan, release, tmp_path)
    sd = Path(slurm_monitoring.sd_dir(deploy_dir(plan)))
    for f in published.iterdir():  # as they were while the job ran
        shutil.copy(f, sd / f.name)
    head = head_dir(release, tmp_path / "etc")
    # a node exporter per node, a GPU exporter per tray, Prometheus and Alertmanager, 18 workers, frontend, master,
    # etcd
    want = len(addresses) + (len(addresses) - 1) + 2 + 18 + 1 + 1 + 1
    active, log = prometheus_targets(head / "prometheus.yml", tmp_path / "tsdb", want)
    by_service = {t["labels"]["service"]: t for t in active}
    assert len(active) == want, log[-2000:]
    decode = by_service["decode-3"]
    assert decode["labels"]["job"] == "dynamo-vllm" and decode["labels"]["role"] == "decode"
    assert decode["labels"]["host"] == "tray10" and decode["scrapeUrl"].startswith(f"http://{addresses['tray10']}:")
    assert by_service["dcgm-exporter-tray01"]["scrapeUrl"] == f"http://{addresses['tray01']}:9400/metrics"
    assert by_service["prometheus"]["labels"]["host"] == slurm_monitoring.HEAD_HOST


def test_a_nodes_health_loop_reports_the_gate_only_while_a_job_publishes_it(
        release: dict[str, bytes], tmp_path: Path, gate_url: str) -> None:
    """The rendered node unit's own command line, run once as the unit would (its install paths under tmp_path):
    with the job's gate file there it reports the gate the file names; between jobs it reports none, so the
    GateCheckMissing rule (absent gate, node_exporter up) speaks only while Prometheus expects a job."""
    health, textfiles, sd = tmp_path / "health", tmp_path / "textfiles", tmp_path / "sd"
    for d in (health, textfiles, sd):
        d.mkdir()
    for rel, data in release.items():
        if rel.startswith("monitoring/node/health/"):
            (health / rel.rsplit("/", 1)[1]).write_bytes(data)
    argv = exec_start(release["monitoring/node/primectl-health.service"])
    swap = {slurm_monitoring.NODE_TEXTFILES: str(textfiles), "%H": "gb001",
            argv[-1]: str(sd / "gate.*.url"), argv[argv.index("--workdir") + 1]: str(tmp_path)}
    run = ["python3", str(health / "health_loop.py"), *[swap.get(a, a) for a in argv[2:]], "--once"]

    def gate_lines() -> list[str]:
        subprocess.run(run, check=True, capture_output=True, timeout=60)
        text = (textfiles / "primectl_health.prom").read_text()
        assert 'primectl_health_check_ok{check="disk",check_host="gb001"}' in text
        return [line for line in text.splitlines() if line.startswith("primectl_gate_ready")]

    assert gate_lines() == []  # between jobs
    Gate.status = 200
    (sd / "gate.4242.url").write_text(f"{gate_url}\n")
    assert gate_lines() == ["primectl_gate_ready 1"]
    # the job's frontend is gone, its file not yet
    (sd / "gate.4242.url").write_text(f"http://127.0.0.1:{free_port()}/v1/models/glm-5.3/ready\n")
    assert gate_lines() == ["primectl_gate_ready 0"]


def test_unit_arguments_reach_the_program_as_they_were_planned() -> None:
    """systemd expands `%` specifiers and splits on blanks: an empty value, a blank or a `%` in a planned argument
    must come through as it was, and only the node's host name is left for systemd to fill in."""
    argv = ["/usr/bin/x", "--gpu-name", "", "--label", "NVIDIA GB200", "--ratio", "50%", "--host", "%H"]
    word = slurm_monitoring._word
    assert [word(a) for a in argv] == ["/usr/bin/x", "--gpu-name", '""', "--label", '"NVIDIA GB200"', "--ratio",
                                       "50%%", "--host", "%H"]
    with pytest.raises(ValueError, match="newline"):
        word("a\nb")
