"""The host agent's file helpers, written on os alone (a host agent that imports shutil or json pays for re):
each does what the stdlib call it replaces does, on real files."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path

import pytest

from primectl.host.files import copy_tree, remove_tree
from primectl.host.json_codec import json_pretty

STATE = {
    "revision": "r-3f2a", "previous_revision": None, "time": 1764800000.25, "ok": True,
    "services": {"decode-1": {"release": "r-3f2a", "unit": "glm-decode-1", "pids": [12, 13], "hash": "ab\u00e9"},
                 "frontend": {"release": "r-3f2a", "ready": {"http": "http://10.0.0.1:8000/health", "timeout_s": 60},
                              "env": {}, "args": []}},
    "roster": ["h1", "h2"], "empty": {}, "nested": [[], [{}], [1, 2.5, -3, False]], "quote": 'a "b" \\ c\n',
}


def test_state_is_written_exactly_as_json_writes_it_indented() -> None:
    assert json_pretty(STATE) == json.dumps(STATE, indent=2, sort_keys=True)
    for value in ({}, [], "x", 0, None, [STATE], OrderedDict(b=OrderedDict(a=(1, {})), a=[])):
        assert json_pretty(value) == json.dumps(value, indent=2, sort_keys=True)


def tree(root: Path) -> None:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "sub" / "weights.bin").write_bytes(os.urandom(3 << 20))  # more than one copy chunk
    (root / "sub" / "run.sh").write_text("#!/bin/sh\n")
    (root / "sub" / "run.sh").chmod(0o750)
    (root / "sub" / "deeper" / "empty").write_text("")
    (root / "link").symlink_to("sub/weights.bin")
    (root / "dirlink").symlink_to("sub")


def listing(root: Path) -> list[tuple[str, str, int, bytes]]:
    out = []
    for p in sorted(root.rglob("*")):
        kind = "link" if p.is_symlink() else "dir" if p.is_dir() else "file"
        out.append((str(p.relative_to(root)), kind, p.lstat().st_mode & 0o7777 if kind != "link" else 0,
                    os.readlink(p).encode() if kind == "link" else p.read_bytes() if kind == "file" else b""))
    return out


def test_a_copied_tree_matches_what_shutil_copies(tmp_path: Path) -> None:
    tree(tmp_path / "src")
    copy_tree(str(tmp_path / "src"), str(tmp_path / "ours"))
    shutil.copytree(tmp_path / "src", tmp_path / "theirs", symlinks=True)
    assert listing(tmp_path / "ours") == listing(tmp_path / "theirs")
    assert (tmp_path / "ours" / "link").is_symlink() and (tmp_path / "ours" / "dirlink").is_symlink()


def test_a_linked_copy_shares_each_file_with_its_source_and_reads_the_same(tmp_path: Path) -> None:
    tree(tmp_path / "src")
    copy_tree(str(tmp_path / "src"), str(tmp_path / "linked"), link=True)
    assert listing(tmp_path / "linked") == listing(tmp_path / "src")
    for rel in ("config.json", "sub/weights.bin", "sub/run.sh", "sub/deeper/empty"):
        assert (tmp_path / "linked" / rel).stat().st_ino == (tmp_path / "src" / rel).stat().st_ino, rel
    assert (tmp_path / "linked" / "link").is_symlink() and (tmp_path / "linked" / "dirlink").is_symlink()


def test_a_linked_copy_across_filesystems_copies_instead(tmp_path: Path) -> None:
    other = Path("/dev/shm")  # tmpfs: another filesystem than the test's tmp_path (links fail with EXDEV)
    if not other.is_dir() or os.stat(other).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a filesystem of its own (Debian mounts a tmpfs there)")
    src = Path(tempfile.mkdtemp(dir=other))
    try:
        tree(src / "src")
        copy_tree(str(src / "src"), str(tmp_path / "copied"), link=True)
        assert listing(tmp_path / "copied") == listing(src / "src")
        assert (tmp_path / "copied" / "config.json").stat().st_dev != (src / "src" / "config.json").stat().st_dev
    finally:
        shutil.rmtree(src)


def test_a_removed_tree_is_gone_and_what_its_links_point_at_stays(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("kept")
    tree(tmp_path / "t")
    (tmp_path / "t" / "out").symlink_to(outside)
    remove_tree(str(tmp_path / "t"))
    assert not (tmp_path / "t").exists()
    assert (outside / "keep").read_text() == "kept"


def test_removing_a_file_a_link_or_nothing(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "l").symlink_to(tmp_path / "f")
    remove_tree(str(tmp_path / "l"))
    assert (tmp_path / "f").exists() and not (tmp_path / "l").is_symlink()
    remove_tree(str(tmp_path / "f"))
    remove_tree(str(tmp_path / "never-was"))
    assert list(tmp_path.iterdir()) == []
