"""The demo serves chat through `engine: sglang`, an engine from a plugin installed outside primectl, with a
service from a component plugin beside it.

examples/primectl-sglang-mocker is installed with pip into a directory under tmp (never into .venv) and
put on PYTHONPATH of every `primectl` run here. A copy of recipes/demo.yaml with `engine: sglang` (and its
host tier off: the mocker's SGLang scheduler has none), its own name, workdir and ports goes `up` (smoke
included: readiness gate, chat, streaming, disaggregation, ...), streams a chat answer with `primectl chat`,
and goes `down`, leaving no process in its workdir. examples/primectl-static-files adds a `static_files:`
block: its file server is started, waited for and smoke-tested by the same `up`, and stopped by `down`.
Each worker runs Dynamo's mocker with `--engine-type sglang`, read back from the running processes.
Run inside a loopback-only network namespace:

    unshare --net -- sh -c 'ip link set lo up && \
        PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python .venv/bin/pytest tests/integration/test_plugin_demo.py -q'
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests import cliproc
from tests.test_plugins import install_examples

from .sshhosts import netns_problem, processes_under

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PRIMECTL = str(REPO / ".venv" / "bin" / "primectl")
FRONTEND_PORT = 18_680
STATIC_PORT = 18_740
GREETING = "served by a component plugin\n"
PORTS = {"worker_system": 18_681, "mooncake_rpc": 18_690, "mooncake_metadata": 18_691, "mooncake_metrics": 18_692,
         "bootstrap": 18_693, "response_stream": 18_700, "tcp_rpc": 18_710, "kv_events": 18_720,
         "frontend_replica": 18_730}
RUN = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python "
       ".venv/bin/pytest tests/integration/test_plugin_demo.py -q'")


def cli(*args: str | Path, site: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    pythonpath = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return cliproc.primectl(*args, timeout=timeout, env={"PYTHONPATH": pythonpath})


@pytest.fixture(scope="module")
def sglang_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """(recipe, workdir, plugin site) of a demo copy with engine: sglang that is up; down at the end."""
    problem = netns_problem(RUN)
    if problem:
        pytest.fail(problem, pytrace=False)
    tmp = tmp_path_factory.mktemp("plugin-demo")
    site = install_examples(tmp / "site")
    doc = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    workdir = tmp / "wd"
    doc["name"] = doc["namespace"] = "sglangdemo"
    doc["engine"] = "sglang"
    doc["host_tier"]["enabled"] = False  # the mocker's SGLang scheduler has no host KV tier (Dynamo 1.6.1)
    doc["hosts"][0]["workdir"] = str(workdir)
    doc["frontend"]["port"] = FRONTEND_PORT
    doc["ports"] = PORTS
    doc["static_files"] = {"host": doc["hosts"][0]["name"], "port": STATIC_PORT, "files": {"hello.txt": GREETING}}
    if os.environ.get("PRIMECTL_RUNTIME_PYTHON"):
        doc.setdefault("software", {})["python"] = os.environ["PRIMECTL_RUNTIME_PYTHON"]
    recipe = tmp / "sglang-demo.yaml"
    recipe.write_text(yaml.safe_dump(doc, sort_keys=False))
    up = cli("up", recipe, site=site, timeout=600)
    try:
        assert up.returncode == 0, f"up failed:\n{up.stdout}\n{up.stderr}"
        smoke = [line for line in up.stderr.splitlines() if "static-files: serves every file as written" in line]
        assert smoke and "pass" in smoke[0], up.stderr
        yield recipe, workdir, site
    finally:
        down = cli("down", recipe, site=site)
        deadline = time.monotonic() + 10
        while processes_under(workdir) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = processes_under(workdir)
        for pid, _ in left:  # only what this test started, by pid
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        assert down.returncode == 0, f"down failed:\n{down.stdout}\n{down.stderr}"
        assert not left, f"processes left after down: {left}"


def test_the_demo_serves_chat_through_the_sglang_engine_plugin(sglang_demo: tuple[Path, Path, Path]) -> None:
    recipe, workdir, site = sglang_demo
    # the mocker, started as `-m dynamo.mocker` or through its token-budget bridge (primectl/bridges/)
    workers = [cmd for _, cmd in processes_under(workdir) if "dynamo.mocker" in cmd or "dynamo_mocker_" in cmd]
    assert len(workers) == 3, workers  # one prefill, two decode
    assert all("--engine-type sglang" in cmd for cmd in workers), workers

    r = cli("chat", recipe, "hi", site=site)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip(), "no answer streamed"
    assert "engine sglang" in r.stderr and f"http://127.0.0.1:{FRONTEND_PORT}" in r.stderr

    status = cli("status", recipe, site=site)
    assert status.returncode == 0, status.stdout + status.stderr


def test_the_component_plugin_serves_its_file_and_status_lists_it(sglang_demo: tuple[Path, Path, Path]) -> None:
    import urllib.request

    recipe, _, site = sglang_demo
    with urllib.request.urlopen(f"http://127.0.0.1:{STATIC_PORT}/hello.txt", timeout=5) as resp:
        assert resp.read().decode() == GREETING
    status = cli("status", recipe, "-o", "json", site=site)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "static-files" in status.stdout
