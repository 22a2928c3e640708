"""Hostile recipe values survive rendering byte-exact and never run as commands.

The rendered run scripts are executed for real with bash. The runtime's `python` (and the
Mooncake master binary next to it) is replaced by a small script that records the argv and
environment it was started with; every hostile value must arrive unchanged, and the command each
one tries to inject must not have run (its marker file must not exist).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from primectl.plan.model import PID, RELEASE, Plan
from primectl.planner.build import build_plan
from primectl.planner.load import load_recipe
from primectl.render.bundle import render_plan, secrets_path, write_bundles


def hostile(marker: Path) -> dict[str, str]:
    """Values that break naive quoting; each tries to create `marker`."""
    m = str(marker)
    return {
        "SEMICOLON": f"a; touch {m}",
        "SUBSHELL": f"$(touch {m})",
        "BACKTICKS": f"`touch {m}`",
        "SINGLE": f"it's'; touch {m}; '",
        "DOUBLE": f'say "hi"; touch {m}; "',
        "NEWLINE": f"first\ntouch {m}\nlast",
        "EXPANSION": "${HOME} $PATH ~ * ?",
        "BACKSLASH": "back\\slash\\n\\\\",
        "AMPERSAND": f"x & touch {m} & y | cat > {m}",
        "DASHES": "--model /etc/passwd",
        "EMPTY": "",
        "UNICODE": "naïve — ✓",
    }


# A worker's listing watch (started beside it, `--pid` its pid) dumps to <out>.watch, the process itself to <out>.
DUMPER = """\
#!{python}
import json, os, sys
with open({out!r} + (".watch" if "--pid" in sys.argv else ""), "w") as f:
    json.dump({{"argv0": sys.argv[0], "argv": sys.argv[1:], "env": dict(os.environ), "pid": os.getpid()}}, f)
"""


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    marker = tmp_path / "INJECTED"
    values = hostile(marker)
    bindir = tmp_path / "runtime" / "bin"
    bindir.mkdir(parents=True)
    dump = tmp_path / "dump.json"
    for program in ("python", "mooncake_master"):
        exe = bindir / program
        exe.write_text(DUMPER.format(python=sys.executable, out=str(dump)))
        exe.chmod(0o755)
    served = "zai-org/GLM-5.3@nvfp4+v1:tp4_a.b"  # every character a served name may hold (quotes etc. are refused)
    recipe = {
        "name": "hostile",
        "model": {"served_name": served, "path": f"/models/it's here; touch {marker}", "arch": "demo-tiny"},
        "hardware": {"profile": "cpu"},
        "hosts": [{"name": "local", "address": "127.0.0.1", "connection": "local",
                   "workdir": str(tmp_path / "work")}],
        "engine": "mocker",
        "supervisor": "process",
        "frontend": {"host": "local"},
        "prefill": {"groups": 1, "parallel": "TP1", "env": values,
                    "extra_args": ["--extra-engine-args", values["DOUBLE"] + values["NEWLINE"]]},
        "decode": {"workers": 1, "parallel": "TP1", "env": values},
        "host_tier": {"master_host": "local", "dram_gb_per_host": 1, "protocol": "tcp"},
        "control_plane": {"discovery": "file"},
        "software": {"python": str(bindir / "python")},
        "secrets": {"API_KEY": "env:PRIMECTL_TEST_HOSTILE_SECRET"},
    }
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True))
    monkeypatch.setenv("PRIMECTL_TEST_HOSTILE_SECRET", values["SINGLE"] + values["NEWLINE"])
    return {"tmp": tmp_path, "marker": marker, "values": values, "dump": dump, "recipe": path, "served": served}


def run_script(script: Path, dump: Path, home: Path) -> dict[str, Any]:
    dump.unlink(missing_ok=True)
    Path(f"{dump}.watch").unlink(missing_ok=True)
    proc = subprocess.run(
        ["/bin/bash", str(script)], cwd=home, capture_output=True, text=True, timeout=20,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(dump.read_text())


def test_hostile_values_reach_the_process_byte_exact_and_inject_nothing(setup: dict[str, Any]) -> None:
    from primectl.pipeline import resolve_secrets

    tmp: Path = setup["tmp"]
    loaded = load_recipe(setup["recipe"])
    plan: Plan = build_plan(loaded.recipe)
    bundles = render_plan(plan)
    out = tmp / "release"
    write_bundles(bundles, out)
    # What apply writes: the secrets env file the run scripts source.
    secrets_file = Path(secrets_path(plan, plan.host("local")))
    secrets_file.parent.mkdir(parents=True)
    secrets_file.write_text(resolve_secrets(plan, str(setup["recipe"])))

    release = (out / "local").resolve()
    ran = []
    for svc in plan.services:
        if svc.role == "balancer":  # HAProxy, not the recipe's Python: no recipe value reaches its argv or env
            assert not svc.env and svc.argv[:3] == ["/usr/sbin/haproxy", "-W", "-db"], svc.argv
            assert svc.argv[-2] == "-f" and set(svc.argv[3:-2]) <= {"-dMglobal"}, svc.argv
            continue
        got = run_script(release / "bin" / f"{svc.name}.sh", setup["dump"], tmp)
        want_argv = [a.replace(RELEASE, str(release)) for a in svc.argv]
        assert [got["argv0"], *got["argv"]] == want_argv, svc.name
        for key, value in svc.env.items():
            assert got["env"][key] == value.replace(RELEASE, str(release)), f"{svc.name}: {key}"
        assert got["env"]["API_KEY"] == setup["values"]["SINGLE"] + setup["values"]["NEWLINE"]
        if svc.watch:  # started beside the process in the background, with the pid it became
            watch = Path(f"{setup['dump']}.watch")
            deadline = time.monotonic() + 10
            while not watch.exists() or not watch.read_text().endswith("}"):
                assert time.monotonic() < deadline, f"{svc.name}: its watch never ran"
                time.sleep(0.05)
            seen = json.loads(watch.read_text())
            want = [a.replace(RELEASE, str(release)).replace(PID, str(got["pid"])) for a in svc.watch]
            assert [seen["argv0"], *seen["argv"]] == want, svc.name
            assert seen["env"]["PRIMECTL_WATCH_OF"] == f"primectl-hostile-{svc.name}"
            assert "PRIMECTL_WATCH_OF" not in got["env"]
        ran.append(svc.name)
        assert not setup["marker"].exists(), f"{svc.name}'s run script executed an injected command"

    assert {"prefill-0", "decode-0", "frontend", "mooncake-master"} <= set(ran)
    prefill = plan.service("prefill-0")
    for key, value in setup["values"].items():
        assert prefill.env[key] == value
    assert setup["served"] in prefill.argv
    assert not setup["marker"].exists()


def test_a_served_name_the_api_paths_cannot_carry_is_refused_at_validate(setup: dict[str, Any], cli: Any) -> None:
    doc = yaml.safe_load(setup["recipe"].read_text())
    marker = setup["marker"]
    for bad in (f"glm's \"5.3\" $(touch {marker}); touch {marker}\nsecond line", "my model", "a%20b", "x?y", "#z"):
        doc["model"]["served_name"] = bad
        setup["recipe"].write_text(yaml.safe_dump(doc, allow_unicode=True))
        r = cli("validate", setup["recipe"])
        assert r.exit_code == 2, bad
        assert "model.served_name" in r.stderr and "allowed: letters, digits and . _ : / @ + -" in r.stderr
    assert not marker.exists()
