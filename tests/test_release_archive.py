"""The archive a release travels in (render.bundle.pack_files / host.files.unpack_files): what lands on a host, and what the
host agent refuses to write."""

from __future__ import annotations

import os
import stat
import zlib
from pathlib import Path

import pytest

from primectl.host.files import unpack_files
from primectl.render.bundle import pack_files


def test_files_arrive_with_their_content_and_modes(tmp_path: Path) -> None:
    files = {"bin/frontend.sh": b"#!/bin/bash\nexec true\n", "config/a b.json": b"{}", "model/w.bin": bytes(range(256)) * 9,
             "model/big.bin": bytes(range(256)) * 64, "empty": b""}  # under and over 4 KiB: packed two ways
    archive = pack_files(files, {"bin/frontend.sh": 0o755})
    assert len(archive) < sum(len(v) for v in files.values())  # compressed
    assert pack_files(files, {"bin/frontend.sh": 0o755}) == archive  # the same bytes for the same files
    into = tmp_path / "rel"
    into.mkdir()
    assert unpack_files(archive, str(into)) == 5
    for path, data in files.items():
        assert (into / path).read_bytes() == data
    assert stat.S_IMODE(os.stat(into / "bin/frontend.sh").st_mode) & 0o100
    assert not stat.S_IMODE(os.stat(into / "config/a b.json").st_mode) & 0o111


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "bin/../../x", "./x", "a//b"])
def test_a_path_that_is_not_plain_and_relative_is_refused(tmp_path: Path, path: str) -> None:
    archive = b"644 10 %s\n%s" % (path.encode(), zlib.compress(b"hi"))
    (tmp_path / "rel").mkdir()
    with pytest.raises(ValueError, match="refusing to unpack"):
        unpack_files(archive, str(tmp_path / "rel"))
    assert not (tmp_path / "escape").exists() and not (tmp_path / "x").exists()


def test_setuid_bits_are_dropped_and_a_broken_archive_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "rel").mkdir()
    unpack_files(pack_files({"s": b"x"}, {"s": 0o4755}), str(tmp_path / "rel"))
    assert not os.stat(tmp_path / "rel" / "s").st_mode & stat.S_ISUID
    for broken in (b"644 8 a\nnot zlib", b"644 99 short\n" + zlib.compress(b"hi"), b"no header"):
        (tmp_path / "r2").mkdir(exist_ok=True)
        with pytest.raises(ValueError):
            unpack_files(broken, str(tmp_path / "r2"))


def test_content_every_host_shares_is_computed_once_while_each_hosts_own_comes_and_goes() -> None:
    """A fleet's bundles hold the same model files and one manifest per host: with more hosts than the cache
    holds, the shared files are still compressed (and hashed) once, not again after every 64 hosts."""
    from primectl.render.bundle import once_per_content

    calls: list[bytes] = []

    def work(data: bytes) -> bytes:
        calls.append(data)
        return data[:1]

    cached = once_per_content(4096)(work)
    shared = b"tokenizer" * 1000
    for host in range(200):
        cached(shared)
        cached(b"manifest of host %d " % host * 400)  # over 4 KiB, one per host
    assert calls.count(shared) == 1, f"the shared content was computed {calls.count(shared)} times"
    assert len(calls) == 201
    small = once_per_content(0)(work)  # what costs more to compute than to look up is remembered at any size
    calls.clear()
    for host in range(200):
        small(b"config.json")
        small(shared)
        for i in range(80):  # a host with many small files of its own
            small(b"bin/worker-%d.sh of host %d" % (i, host))
    assert calls.count(b"config.json") == 1 and calls.count(shared) == 1, "shared content was computed again"
