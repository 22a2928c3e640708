"""The demo cluster for real: Dynamo frontend + KV router, mocker workers, Mooncake master, etcd.

`recipes/demo.yaml` is brought up locally and `recipes/demo-multihost.yaml` over the
three real sshd hosts, through exactly the code path that deploys GB200 racks. Requests go
through the official `openai` client; the workers' own /metrics show that prefill and
decode both served. The host runtime comes from PRIMECTL_RUNTIME_PYTHON (`make test`
builds it with scripts/install-runtime.sh).
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import cliproc

from .conftest import REPO, Deployment, deep_merge, ports_for
from .sshhosts import kill_leftovers, processes_under

pytestmark = pytest.mark.integration

COUNTER = re.compile(r'^dynamo_component_requests_total\{([^}]*)\}\s+([0-9.e+]+)$', re.M)


def runtime_python() -> str:
    python = os.environ.get("PRIMECTL_RUNTIME_PYTHON", "")
    if not (python and os.access(python, os.X_OK)):
        pytest.fail("PRIMECTL_RUNTIME_PYTHON must name the host runtime's python (make test sets it; "
                    "build one with `bash scripts/install-runtime.sh .runtime`)", pytrace=False)
    return python


def served(metrics_url: str, component: str) -> float:
    """Requests a worker served on its generate endpoint, from its own /metrics."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    total = 0.0
    for labels, value in COUNTER.findall(text):
        if f'dynamo_component="{component}"' in labels and 'dynamo_endpoint="generate"' in labels:
            total += float(value)
    return total


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return cliproc.primectl(*args, timeout=timeout)


def check_serving(endpoint: str, metrics: dict[str, list[str]]) -> None:
    """Chat streaming and not through the openai client; prefill and decode counters both move."""
    from openai import OpenAI

    before = {role: sum(served(u, "prefill" if role == "prefill" else "backend") for u in urls)
              for role, urls in metrics.items()}
    client = OpenAI(base_url=f"{endpoint}/v1", api_key="none", timeout=30)
    reply = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert reply.choices[0].message.content and reply.choices[0].message.content.strip()
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    chunks = [c.choices[0].delta.content for c in client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "stream please"}], max_tokens=6, stream=True)
        if c.choices and c.choices[0].delta.content]
    assert len(chunks) == 6, f"one content delta per token expected, got {chunks}"
    after = {role: sum(served(u, "prefill" if role == "prefill" else "backend") for u in urls)
             for role, urls in metrics.items()}
    assert after["prefill"] >= before["prefill"] + 2, "the prefill worker did not serve the requests"
    assert after["decode"] >= before["decode"] + 2, "the decode workers did not serve the requests"


def check_over_context(endpoint: str, limit: int, metrics: dict[str, list[str]]) -> None:
    """A prompt over the context limit: the frontend itself refuses it with 400 naming the limit and the prompt's
    tokens, before any worker sees it (issue #37: it was the mocker's 500 after 3 migrations), and keeps serving."""
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=f"{endpoint}/v1", api_key="none", timeout=60, max_retries=0)
    before = sum(served(u, "prefill") for u in metrics["prefill"])
    with pytest.raises(BadRequestError) as refused:  # "word " is 3 tokens of the demo tokenizer
        client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "word " * (limit // 3 + 100)}],
                                       max_tokens=4)
    assert refused.value.status_code == 400
    body = refused.value.body
    assert isinstance(body, dict) and body["details"]["type"] == "context_length", body
    assert body["details"]["limit"] == limit and body["details"]["actual"] > limit, body
    assert sum(served(u, "prefill") for u in metrics["prefill"]) == before, "an over-long prompt reached a worker"
    reply = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.choices and reply.choices[0].finish_reason == "length"


def _metrics(plan_json: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"prefill": [], "decode": []}
    for svc in plan_json["services"]:
        if svc["role"] in out:
            out[svc["role"]].append(svc["metrics_url"])
    return out


@pytest.fixture
def local_demo(tmp_path: Path) -> Iterator[Path]:
    """recipes/demo.yaml with its own workdir and ports, so it never meets a `make demo` cluster."""
    fe_port, ports = ports_for(90)
    doc = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    doc = deep_merge(doc, {
        "name": "demo-local-test",
        "hosts": [{"name": "local", "address": "127.0.0.1", "connection": "local", "workdir": str(tmp_path / "work")}],
        "frontend": {"port": fe_port},
        "ports": ports | {"mooncake_rpc": fe_port + 60, "mooncake_metadata": fe_port + 61, "mooncake_metrics": fe_port + 62},
        "software": {"python": runtime_python()},
    })
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    yield path
    down = run("down", str(path), "--break-lock")
    left = processes_under(tmp_path / "work")
    kill_leftovers(tmp_path / "work")
    assert down.returncode == 0, down.stderr
    assert not left, f"processes left behind: {left}"


def test_demo_up_serves_chat_then_down_leaves_nothing(local_demo: Path) -> None:
    up = run("up", str(local_demo), "--no-smoke")
    assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
    plan = yaml.safe_load(run("plan", str(local_demo), "--output", "json").stdout)
    gate = urllib.request.urlopen(plan["gate"]["url"], timeout=5)
    assert gate.status == 200
    check_serving(plan["endpoint"], _metrics(plan))
    check_over_context(plan["endpoint"], yaml.safe_load(local_demo.read_text())["model"]["max_context"], _metrics(plan))
    again = run("up", str(local_demo), "--no-smoke")
    assert again.returncode == 0 and "no changes" in again.stderr
    logs = run("logs", str(local_demo), "decode-0", "--tail", "2000")
    assert logs.returncode == 0 and "primectl: starting decode-0" in logs.stdout
    typo = run("logs", str(local_demo), "decode-9")
    assert typo.returncode == 2 and "did you mean" in typo.stderr


def test_demo_multihost_over_ssh_with_etcd(deployment: Deployment) -> None:
    """recipes/demo-multihost.yaml's layout on the three sshd hosts, real Dynamo + etcd + Mooncake."""
    doc = yaml.safe_load((REPO / "recipes" / "demo-multihost.yaml").read_text())
    fe_port = deployment.frontend_port
    changes = {
        "software": {"python": runtime_python()},
        "model": {"max_context": 32768},
        "frontend": {"session_affinity": doc.get("frontend", {}).get("session_affinity", {"ttl_secs": 600})},
        "host_tier": {"master_host": "h1", "dram_gb_per_host": 1, "protocol": "tcp"},
        "ports": {"mooncake_rpc": fe_port + 60, "mooncake_metadata": fe_port + 61, "mooncake_metrics": fe_port + 62},
        "prefill": {"startup_timeout_s": 90}, "decode": {"startup_timeout_s": 90},
    }
    assert doc["control_plane"]["discovery"] == "etcd" and doc["prefill"]["hosts"] == ["h2"]
    recipe = deployment.write(changes)
    up = deployment.cli("up", "--no-smoke", timeout=300)
    assert up.returncode == 0, f"{up.stdout}\n{up.stderr}"
    plan = yaml.safe_load(deployment.cli("plan", "--output", "json").stdout)
    assert {s["name"]: s["host"] for s in plan["services"]}["mooncake-master"] == "h1"
    check_serving(plan["endpoint"], _metrics(plan))
    status = deployment.cli("status", "--output", "json")
    assert status.returncode == 0, status.stdout
    down = deployment.cli("down", recipe=recipe)
    assert down.returncode == 0
    assert not deployment.leftovers()
