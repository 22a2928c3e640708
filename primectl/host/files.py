"""Files on a host: JSON files read, files written atomically, trees copied and removed, release archives
unpacked. Written on os alone: shutil and tarfile cost a host agent more CPU to import than its work.
"""

from __future__ import annotations

import os

from primectl.host.json_codec import json_loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def read_json(path: str) -> Any:
    """A JSON file's content, None when it does not exist."""
    try:
        with open(path) as f:
            return json_loads(f.read())
    except FileNotFoundError:
        return None


def unpack_files(archive: bytes, into: str) -> int:
    """Write the files of a release archive under the directory `into` (which must be new and empty); how many.
    The archive (`render.bundle.pack_files` makes it) is one record per file, in path order: `<octal mode>
    <compressed size> <path>\\n`, then the file zlib-compressed. Not tar: importing tarfile and gzip and walking
    tar headers cost a host agent ~20 ms of CPU, more than writing the files. ValueError for a path that is
    absolute, climbs out (`..`) or is not plain, or a broken archive; modes keep their permission bits only."""
    import zlib

    at, count = 0, 0
    made: set[str] = set()
    while at < len(archive):
        end = archive.find(b"\n", at)
        words = archive[at:end].split(b" ", 2) if end >= 0 else []
        if len(words) != 3 or not words[1].isdigit():
            raise ValueError(f"not a release archive (record at byte {at})")
        path, size, start = words[2].decode(errors="replace"), int(words[1]), end + 1
        parts = path.split("/")
        if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or start + size > len(archive):
            raise ValueError(f"refusing to unpack {path!r}")
        try:
            data = zlib.decompress(archive[start:start + size])
        except zlib.error as exc:
            raise ValueError(f"not a release archive ({path}: {exc})") from None
        target = os.path.join(into, path)
        parent = os.path.dirname(target)
        if parent not in made:  # files come in path order: each directory is made once, not once per file
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, int(words[0], 8) & 0o777)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        at, count = start + size, count + 1
    return count


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write a file so readers see the old or the new content, never a mix."""
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


# shutil imports re, fnmatch, bz2 and lzma: 8 ms of a host agent's CPU, as much as the rest of a stage. The
# agent's few tree operations are written on os instead.
def remove_tree(path: str) -> None:
    """Remove a file, a symlink or a directory tree, as `rm -rf` does: what cannot be removed is left."""
    if os.path.islink(path) or not os.path.isdir(path):
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    for root, dirs, names in os.walk(path, topdown=False):
        for name in names:
            try:
                os.unlink(os.path.join(root, name))
            except OSError:
                pass
        for name in dirs:
            sub = os.path.join(root, name)
            try:
                os.unlink(sub) if os.path.islink(sub) else os.rmdir(sub)
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


def copy_tree(src: str, dst: str, *, link: bool = False) -> None:
    """Copy a directory tree: files with their permission bits, symlinks as symlinks (`dst` must not exist).
    With `link`, a file becomes a hard link to its source where the filesystem allows one (no data copied, no
    inode allocated), a copy where not: for trees nobody writes to once made."""
    for root, dirs, names in os.walk(src):
        target = os.path.join(dst, os.path.relpath(root, src))
        os.makedirs(target, exist_ok=root != src)
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            source, copy = os.path.join(root, name), os.path.join(target, name)
            if os.path.islink(source):
                os.symlink(os.readlink(source), copy)
                continue
            if link:
                try:
                    os.link(source, copy)
                    continue
                except OSError:  # another filesystem, or one without hard links: copy it
                    link = False
            with open(source, "rb") as f, open(copy, "wb") as g:
                while chunk := f.read(1 << 20):
                    g.write(chunk)
            os.chmod(copy, os.stat(source).st_mode & 0o7777)
