"""The host agent's loader: the agent is uploaded once per host and version, verified by hash, then imported."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from primectl.deploy.transport import AGENT_DIR, agent_hash, agent_source, loader_command


def start(workdir: Path, *, payload: bytes | None = None) -> tuple[list[str], dict | None, subprocess.Popen]:
    """Run the loader as a host would, with one op's request sent at once (before the loader answers, as a
    session does); answer `send` with `payload` (the agent source by default)."""
    proc = subprocess.Popen(["sh", "-c", loader_command(str(workdir), "serve")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin and proc.stdout
    proc.stdin.write((json.dumps({"op": "read", "args": {"workdir": str(workdir), "path": "nothing"}}) + "\n").encode())
    proc.stdin.flush()
    said = []
    while True:
        line = proc.stdout.readline().decode()
        if not line:
            proc.wait()
            return said, None, proc
        said.append(line.strip())
        if line.startswith('{"agent": "send"}'):
            data = agent_source().encode() if payload is None else payload
            proc.stdin.write(b"%d\n" % len(data) + data)
            proc.stdin.flush()
        elif line.startswith('{"agent": "ready"}'):
            break
    result = json.loads(proc.stdout.readline())  # the first request's answer, with nothing more written
    proc.stdin.close()
    proc.wait()
    return said, result, proc


def cached(workdir: Path) -> Path:
    return workdir / AGENT_DIR / agent_hash()[:16] / "primectl_agent.py"


def test_first_start_uploads_into_a_missing_workdir_then_imports_the_cached_copy(tmp_path: Path) -> None:
    wd = tmp_path / "not" / "yet"
    said, result, _ = start(wd)
    assert said == ['{"agent": "send"}', '{"agent": "ready"}']
    assert result and result["ok"]
    assert cached(wd).read_text() == agent_source()
    said, result, _ = start(wd)
    assert said == ['{"agent": "ready"}'] and result and result["ok"]
    assert list((cached(wd).parent / "__pycache__").glob("primectl_agent.*.pyc"))  # the bytecode cache applies
    assert [p.name for p in cached(wd).parent.iterdir() if p.name.endswith(".tmp")] == []


def test_a_damaged_cached_copy_is_replaced(tmp_path: Path) -> None:
    start(tmp_path)
    cached(tmp_path).write_text("import os; os._exit(7)\n")
    said, result, _ = start(tmp_path)
    assert said[0] == '{"agent": "send"}' and result and result["ok"]
    assert cached(tmp_path).read_text() == agent_source()


def test_an_upload_that_does_not_match_the_hash_is_refused(tmp_path: Path) -> None:
    said, result, proc = start(tmp_path, payload=b"print('not the agent')\n")
    assert said == ['{"agent": "send"}'] and result is None
    assert proc.returncode != 0
    assert proc.stderr and b"does not match its hash" in proc.stderr.read()
    assert not cached(tmp_path).exists()


def test_an_unwritable_cache_still_serves_from_memory(tmp_path: Path) -> None:
    if os.geteuid() == 0:  # root writes anywhere: block the directory with a file instead
        (tmp_path / AGENT_DIR).write_text("in the way")
    else:
        tmp_path.chmod(0o500)
    try:
        said, result, _ = start(tmp_path)
    finally:
        tmp_path.chmod(0o700)
    assert said == ['{"agent": "send"}', '{"agent": "ready"}']
    assert result and result["ok"]
