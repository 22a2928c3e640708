"""The host agent's loader: the agent's bundle is uploaded once per host and version, verified by hash, then its
package imported.

Each test gives the loader a cache of its own (XDG_CACHE_HOME), as each host has its own login user's cache."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from primectl.deploy.shipping import (
    AGENT_ENTRY,
    KEEP_AGENT_VERSIONS,
    agent_bundle,
    agent_hash,
    loader_command,
    modules_for,
)
from primectl.deploy.transport import start_agent_session
from primectl.host.agent import AGENT_DIR


def start(workdir: Path, cache: Path, *, payload: bytes | None = None) -> tuple[list[str], dict | None, subprocess.Popen]:
    """Run the loader as a host would, with one op's request sent at once (before the loader answers, as a
    session does); answer `send` with `payload` (the agent's bundle by default). `cache` is the login user's
    XDG_CACHE_HOME."""
    proc = subprocess.Popen(["sh", "-c", loader_command(str(workdir), "serve")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "XDG_CACHE_HOME": str(cache)})
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
            data = agent_bundle() if payload is None else payload
            proc.stdin.write(b"%d\n" % len(data) + data)
            proc.stdin.flush()
        elif line.startswith('{"agent": "ready"}'):
            break
    result = json.loads(proc.stdout.readline())  # the first request's answer, with nothing more written
    proc.stdin.close()
    proc.wait()
    return said, result, proc


def cached(where: Path) -> Path:
    """The cached copy in a cache directory (`cache/primectl/agent`, or a workdir's `agent`)."""
    return where / agent_hash()[:16]


def entry(copy: Path) -> Path:
    """The file of the agent's entry module in a cached copy."""
    return copy / (AGENT_ENTRY.replace(".", "/") + ".py")


def intact(copy: Path) -> bool:
    """Whether a cached copy holds every file of the bundle as primectl has it, and lists them."""
    return all((copy / path).read_bytes() == data for path, data in modules_for(AGENT_ENTRY).items()) and \
        (copy / "files").read_text().split() == sorted(modules_for(AGENT_ENTRY))


def test_first_start_uploads_into_a_missing_cache_then_imports_the_cached_copy(tmp_path: Path) -> None:
    wd, cache = tmp_path / "wd", tmp_path / "not" / "yet"
    said, result, _ = start(wd, cache)
    assert said == ['{"agent": "send"}', '{"agent": "ready"}']
    assert result and result["ok"]
    home = cache / "primectl" / "agent"
    assert intact(cached(home))
    assert not (wd / AGENT_DIR).exists()  # the login user's cache holds it, not the deployment
    said, result, _ = start(wd, cache)
    assert said == ['{"agent": "ready"}'] and result and result["ok"]
    module = entry(cached(home))
    assert list((module.parent / "__pycache__").glob(f"{module.stem}.*.pyc"))  # the bytecode cache applies
    assert [p.name for p in cached(home).rglob("*.tmp")] == []


def test_a_new_deployment_on_the_host_uses_the_copy_already_there(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    start(tmp_path / "first", cache)
    said, result, _ = start(tmp_path / "second", cache)
    assert said == ['{"agent": "ready"}'] and result and result["ok"]


def test_the_cache_keeps_the_newest_versions_only(tmp_path: Path) -> None:
    home = tmp_path / "cache" / "primectl" / "agent"
    for i in range(KEEP_AGENT_VERSIONS + 2):  # older versions, oldest first
        (home / f"old{i}").mkdir(parents=True)
        (home / f"old{i}" / "files").write_text("# an older agent\n")
        os.utime(home / f"old{i}", (1000 + i, 1000 + i))
    start(tmp_path / "wd", tmp_path / "cache")
    assert sorted(p.name for p in home.iterdir()) == sorted(
        [agent_hash()[:16]] + [f"old{i}" for i in range(3, KEEP_AGENT_VERSIONS + 2)])


def test_a_damaged_cached_copy_is_replaced(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    start(tmp_path, cache)
    entry(cached(cache / "primectl" / "agent")).write_text("import os; os._exit(7)\n")
    said, result, _ = start(tmp_path, cache)
    assert said[0] == '{"agent": "send"}' and result and result["ok"]
    assert intact(cached(cache / "primectl" / "agent"))


def test_a_cached_copy_missing_a_module_is_replaced(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    start(tmp_path, cache)
    entry(cached(cache / "primectl" / "agent")).unlink()
    said, result, _ = start(tmp_path, cache)
    assert said[0] == '{"agent": "send"}' and result and result["ok"]
    assert intact(cached(cache / "primectl" / "agent"))


def test_an_upload_that_does_not_match_the_hash_is_refused(tmp_path: Path) -> None:
    said, result, proc = start(tmp_path, tmp_path / "cache", payload=b"print('not the agent')\n")
    assert said == ['{"agent": "send"}'] and result is None
    assert proc.returncode != 0
    assert proc.stderr and b"does not match its hash" in proc.stderr.read()
    assert not (tmp_path / "cache" / "primectl").exists()


def block(path: Path) -> None:
    """Make `path` unwritable for the loader: root writes anywhere, so a file stands where the directory goes."""
    if os.geteuid() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("in the way")
    else:
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o500)


def test_an_unwritable_user_cache_falls_back_to_the_workdir(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    block(cache / "primectl")
    said, result, _ = start(tmp_path / "wd", cache)
    assert said == ['{"agent": "send"}', '{"agent": "ready"}'] and result and result["ok"]
    assert intact(cached(tmp_path / "wd" / AGENT_DIR))
    said, result, _ = start(tmp_path / "wd", cache)
    assert said == ['{"agent": "ready"}'] and result and result["ok"]


def test_no_writable_cache_still_serves_from_memory(tmp_path: Path) -> None:
    cache, wd = tmp_path / "cache", tmp_path / "wd"
    block(cache / "primectl")
    block(wd / AGENT_DIR)
    try:
        said, result, _ = start(wd, cache)
    finally:
        for p in (cache / "primectl", wd / AGENT_DIR):
            if p.is_dir():
                p.chmod(0o700)
    assert said == ['{"agent": "send"}', '{"agent": "ready"}']
    assert result and result["ok"]


def test_hosts_that_start_at_once_share_one_upload_safely(tmp_path: Path) -> None:
    """Many sessions on one host with an empty cache (a fleet of `connection: local` hosts, or several commands
    at once): each writes the same files atomically, and every one of them starts."""
    from concurrent.futures import ThreadPoolExecutor

    cache = tmp_path / "cache"
    with ThreadPoolExecutor(8) as pool:
        runs = list(pool.map(lambda i: start(tmp_path / f"wd{i}", cache), range(8)))
    assert all(result and result["ok"] for _, result, _ in runs)
    assert intact(cached(cache / "primectl" / "agent"))
    assert not any((tmp_path / f"wd{i}" / AGENT_DIR).exists() for i in range(8))


class _EndedSession:
    """An agent session over the pipes of a local process that has already exited (stdout and stderr merged), as
    AgentStream reads one."""

    def __init__(self, script: str):
        self.proc = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        self.proc.wait()

    def send(self, data: bytes) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def readline(self) -> bytes:
        assert self.proc.stdout
        return self.proc.stdout.readline()

    def limit(self, seconds: float | None) -> None:
        pass

    def __enter__(self) -> _EndedSession:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            assert f
            try:
                f.close()
            except BrokenPipeError:  # what the unread request left in stdin's buffer cannot go anywhere
                pass


def test_a_session_that_ended_before_its_first_request_is_reported_by_what_it_said() -> None:
    """A host behind a head node that refuses the head's ssh: the session can end before primectl writes its first
    request. Whatever the write raises, the error is what the session printed, as when the write came first."""
    said = "ssh: connect to host 127.0.0.4 port 22: Connection refused"
    with _EndedSession(f"echo '{said}' >&2; exit 255") as session, \
            pytest.raises(EOFError, match=f"^the host agent did not start: {said}$"):
        start_agent_session(session, b'{"op": "read"}\n')


def test_a_session_that_said_nothing_keeps_the_error_of_the_write() -> None:
    with _EndedSession("exit 0") as session, pytest.raises(BrokenPipeError):
        start_agent_session(session, b"x\n")
