"""How host code reaches a host: the host package's modules as one bundle, and the loader that runs them there.

What runs on a host is primectl.host (and primectl.plan.layout, which it shares with the controller): stdlib
only modules, run with the host's own `python3` and nothing of primectl installed. The agent's modules travel as
one bundle (`agent_bundle`, named by `agent_hash`); `loader_command` is the shell command that starts the agent
from its cached copy, asking for the bundle when the host has none (see LOADER). Where a file must carry host
code by itself (a Slurm job's bin/primectl-wait), the modules it needs go into a zip application (`zipapp`).
"""

from __future__ import annotations

import functools
import hashlib
import io
import posixpath
import re
import shlex
import zipfile
from collections.abc import Mapping
from importlib.resources import files

from primectl.host.agent import AGENT_DIR

KEEP_AGENT_VERSIONS = 4  # cached agent versions a host keeps (operators with different primectl versions share it)
AGENT_ENTRY = "primectl.host.agent"  # the module whose main(argv) the loader runs


@functools.cache
def host_modules() -> Mapping[str, bytes]:
    """The files a host may get, by path under primectl's source root: the host package, and what it shares
    with the controller (the host layout). A directory that is a namespace package here (primectl/plan) gets an
    empty __init__.py: zipimport does not import namespace packages."""
    root = files("primectl")
    paths = ["__init__.py", *(f"host/{f.name}" for f in root.joinpath("host").iterdir() if f.name.endswith(".py")),
             "plan/layout.py"]
    named = {f"primectl/{path}": root.joinpath(path).read_bytes() for path in paths}
    for path in list(named):
        named.setdefault(f"{posixpath.dirname(path)}/__init__.py", b"")
    return dict(sorted(named.items()))


def module_name(path: str) -> str:
    """primectl/host/agent.py -> primectl.host.agent; primectl/host/__init__.py -> primectl.host."""
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


# An import statement, read without parsing the module (ast.parse of the host package costs every command
# ~25 ms, for the agent's hash): `import a.b, c` or `from a.b import c, d` (in parentheses over lines too).
IMPORT = re.compile(r"^[ \t]*(?:import[ \t]+([\w., \t]+)|from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*))", re.M)


def imports_in(source: bytes) -> set[str]:
    """The modules an import statement of `source` names, and for `from a import b` also a.b (b may be one)."""
    out: set[str] = set()
    for plain, base, names in IMPORT.findall(source.decode()):
        words = [w.split()[0] for w in (plain or names).strip("()").replace("\n", " ").split(",") if w.strip()]
        out |= set(words) if plain else {base, *(f"{base}.{w}" for w in words)}
    return out


@functools.cache
def modules_for(entry: str) -> Mapping[str, bytes]:
    """The files a host needs to run module `entry`: it, every shipped module it imports (at the top or in a
    function, for the type checker too), theirs in turn, and the __init__.py of each package on the way."""
    shipped = host_modules()
    path_of = {module_name(path): path for path in shipped}
    need: set[str] = set()
    todo = [entry]
    while todo:
        name = todo.pop()
        if path_of[name] in need:
            continue
        need.add(path_of[name])
        todo += [name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1)]  # its packages
        todo += sorted(imports_in(shipped[path_of[name]]) & set(path_of))
    return {path: shipped[path] for path in sorted(need)}


def pack(named: Mapping[str, bytes]) -> bytes:
    """Files as one bundle, in path order: for each, `<path> <size>\\n` then its bytes (the loader reads it back)."""
    return b"".join(b"%s %d\n" % (path.encode(), len(data)) + data for path, data in sorted(named.items()))


@functools.cache
def agent_bundle() -> bytes:
    """The agent's modules, packed (`pack`): what a host that has no copy of this version receives."""
    return pack(modules_for(AGENT_ENTRY))


@functools.cache
def agent_hash() -> str:
    """sha256 of the agent's bundle: names its cached copy on each host."""
    return hashlib.sha256(agent_bundle()).hexdigest()


# The agent is cached on each host, keyed by the hash of its bundle, and imported from there as a package (so
# Python's bytecode cache applies): a connection starts this small loader, which says `ready` when a cached
# copy is there and intact (its files, listed in `files`, packed again match the hash), or `send` when it needs
# the bundle (then `<length>` and the bytes come on stdin; it checks them against the hash and writes each
# file atomically, creating the directories, and the list last). The copy lives in the login user's cache
# (`$XDG_CACHE_HOME` or ~/.cache, under primectl/agent), shared by every deployment on the host, so that a new
# deployment (each variant of a sweep) neither uploads nor compiles it again; the loader keeps the newest few
# versions there. Where that cannot be written, the copy goes under the deployment's workdir, and where neither
# can, the received modules are imported from memory. A session (`serve`) sends its first request right after
# the command, before the loader has answered, so that a host costs one round trip, not two: the loader reads
# that line first and hands it to the agent. Its `ready` goes out with the answer to that request, in one
# packet.
LOADER = """\
import os, sys
try:
    from _sha256 import sha256
except ImportError:
    from hashlib import sha256
w, h = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
if args == ['serve']:
    args.append(sys.stdin.buffer.readline().decode())
c = os.path.join(os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache'), 'primectl', 'agent')
dirs = [d for d in (c, w) if os.path.isabs(d)]
def pack(p, names):
    out = []
    for n in names:
        with open(os.path.join(p, n), 'rb') as x:
            b = x.read()
        out.append(b'%s %d\\n' % (n.encode(), len(b)) + b)
    return b''.join(out)
data = None
for d in dirs:
    p = os.path.join(d, h[:16])
    try:
        with open(os.path.join(p, 'files'), 'rb') as x:
            if sha256(pack(p, x.read().decode().split())).hexdigest() == h:
                break
    except OSError:
        pass
else:
    sys.stdout.write('{"agent": "send"}\\n'); sys.stdout.flush()
    data = sys.stdin.buffer.read(int(sys.stdin.buffer.readline()))
    if sha256(data).hexdigest() != h:
        sys.exit('primectl agent: the uploaded source does not match its hash')
    got, i = {}, 0
    while i < len(data):
        j = data.index(b'\\n', i)
        n, s = data[i:j].decode().rsplit(' ', 1)
        i = j + 1 + int(s)
        got[n] = data[j + 1:i]
    for d in dirs:
        p = os.path.join(d, h[:16])
        try:
            for n, b in [*got.items(), ('files', '\\n'.join(got).encode())]:
                f = os.path.join(p, n)
                os.makedirs(os.path.dirname(f), exist_ok=True)
                t = '%s.%d.tmp' % (f, os.getpid())
                with open(t, 'wb') as x:
                    x.write(b); x.flush(); os.fsync(x.fileno())
                os.replace(t, f)
        except OSError:
            continue
        data = None
        try:
            old = sorted(os.listdir(d), key=lambda n: os.stat(os.path.join(d, n)).st_mtime)[:-KEEP]
        except OSError:
            old = []
        if old:
            import shutil
            for n in old:
                shutil.rmtree(os.path.join(d, n), ignore_errors=True)
        break
sys.stdout.write('{"agent": "ready"}\\n')
if data is None:
    sys.path.insert(0, p)
else:
    from importlib.machinery import ModuleSpec
    mods = {n[:-3].replace('/', '.').removesuffix('.__init__'): (n, b) for n, b in got.items()}
    class Memory:
        @classmethod
        def find_spec(cls, name, *rest):
            return ModuleSpec(name, cls, is_package=mods[name][0].endswith('__init__.py')) if name in mods else None
        @staticmethod
        def create_module(spec):
            return None
        @staticmethod
        def exec_module(m):
            n, b = mods[m.__name__]
            exec(compile(b, n, 'exec'), m.__dict__)
    sys.meta_path.insert(0, Memory)
from ENTRY import main
sys.exit(main(['primectl-agent'] + args))
""".replace("KEEP", str(KEEP_AGENT_VERSIONS)).replace("ENTRY", AGENT_ENTRY)


def loader_args(workdir: str, *words: str) -> list[str]:
    """What follows `python3 -I -S -c` to start the agent from its cached copy under `workdir` (see LOADER), with
    `words` for the agent (`serve`, or an operation and its JSON arguments)."""
    return [LOADER, posixpath.join(workdir, AGENT_DIR), agent_hash(), *words]


def loader_command(workdir: str, *words: str) -> str:
    """The shell command that starts the agent from its cached copy under `workdir` (see LOADER)."""
    return " ".join(["python3 -I -S -c", *map(shlex.quote, loader_args(workdir, *words))])


ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # every member's time: a zipapp's bytes depend on its files alone


def zipapp(entry: str) -> bytes:
    """A Python zip application of the modules `entry` needs (modules_for): `python3 <file> ARGS...` runs
    `entry`'s main(ARGS) and exits with what it returns; a shebang makes the file executable by itself. Stored,
    not compressed, so that the same files make the same bytes with any zlib."""
    main = f"import sys\nfrom {entry} import main\nsys.exit(main(sys.argv[1:]))\n"
    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for path, data in [*modules_for(entry).items(), ("__main__.py", main.encode())]:
            info = zipfile.ZipInfo(path, ZIP_TIME)
            info.external_attr = 0o644 << 16
            z.writestr(info, data)
    return buf.getvalue()
