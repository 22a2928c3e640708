"""How the host agent reaches a host: its package's modules as one bundle, and the loader that runs them there.

The agent is a package of stdlib-only modules (`AGENT_FILES`), run on a host with that host's `python3` from a
directory of their own on `sys.path`: nothing of primectl is installed there. `agent_bundle` is those files
as the bytes a host receives, `agent_hash` names that version, and `loader_command` is the shell command that
starts the agent from its cached copy, asking for the bundle when the host has none (see LOADER).
"""

from __future__ import annotations

import functools
import hashlib
import posixpath
import shlex
from importlib.resources import files

from primectl.deploy.agent import AGENT_DIR

KEEP_AGENT_VERSIONS = 4  # cached agent versions a host keeps (operators with different primectl versions share it)
AGENT_ENTRY = "primectl.deploy.agent"  # the module whose main(argv) the loader runs
# The agent's modules, as paths under primectl's source root (the package directories they sit in come with
# them; a package without an __init__.py in the list is a namespace package on the host too).
AGENT_FILES = ("primectl/__init__.py", "primectl/deploy/__init__.py", "primectl/deploy/protocol.py",
               "primectl/deploy/agent.py")


def source_of(path: str) -> bytes:
    """The bytes of one of primectl's own files, `path` as in AGENT_FILES (primectl/...)."""
    root, _, rest = path.partition("/")
    assert root == "primectl", path
    return files("primectl").joinpath(rest).read_bytes()


def pack(named: dict[str, bytes]) -> bytes:
    """Files as one bundle, in path order: for each, `<path> <size>\\n` then its bytes (the loader reads it back)."""
    return b"".join(b"%s %d\n" % (path.encode(), len(data)) + data for path, data in sorted(named.items()))


@functools.cache
def agent_bundle() -> bytes:
    """The host agent's modules, packed (`pack`): what a host that has no copy of this version receives."""
    return pack({path: source_of(path) for path in AGENT_FILES})


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
    mods = {}
    for n, b in got.items():
        k = n[:-3].split('/')
        if k[-1] == '__init__':
            k.pop()
        for j in range(1, len(k)):
            mods.setdefault('.'.join(k[:j]), (n, b'', True))
        mods['.'.join(k)] = (n, b, n.endswith('/__init__.py'))
    class Memory:
        @classmethod
        def find_spec(cls, name, *rest):
            return ModuleSpec(name, cls, is_package=mods[name][2]) if name in mods else None
        @staticmethod
        def create_module(spec):
            return None
        @staticmethod
        def exec_module(m):
            n, b, _ = mods[m.__name__]
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
