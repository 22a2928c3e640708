"""Plan -> per-host bundles: `{path: bytes}`, byte-identical for the same plan.

A bundle holds one run script per service (env + exec argv, every value
shell-quoted), a systemd unit per service, the service's config files, the
generated model directory when the plan's model source asks for one, and a
manifest with, per service, the hash of what changes how it runs (a change
restarts it), the hash of what primectl expects of it (a change does not), and
a hash per field so `diff` can name what changed. Revision = hash of the
bundle's files. The Plan is the only input.
"""

from __future__ import annotations

import hashlib
import shlex
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from primectl.host.json_codec import json_pretty
from primectl.host.processes import WATCH_ENV
from primectl.plan.layout import Layout
from primectl.plan.layout import unit_name as layout_unit_name
from primectl.plan.model import EXPECT_FIELDS, PID, RELEASE, FileSpec, HostPlan, Plan, Service
from primectl.recipe.model import ENV_NAME_RE

MANIFEST = "manifest.json"
SHARED_MODEL_MARK = "model/.primectl-shared-name"
MODEL_ROLES = ("prefill", "decode", "frontend")
# Roles a unit waits for at boot (workers register dynamically: the frontend never waits for them).
UNIT_AFTER_ROLES = ("control", "cache")


@dataclass(frozen=True)
class Bundle:
    """The files one host receives, and the revision they make."""

    host: str
    files: dict[str, bytes]
    modes: dict[str, int]
    revision: str
    manifest: dict[str, object]

    @property
    def services(self) -> dict[str, dict[str, object]]:
        """Per service: hashes (run, files, expectations, per field), component, role, unit, files."""
        return self.manifest["services"]  # type: ignore[return-value]

    def archive(self) -> bytes:
        """The bundle as the archive a host stages (`pack_files`): its files with their modes, compressed (the
        demo model's tokenizer makes a bundle ~180 KiB, ~30 KiB compressed)."""
        return pack_files(self.files, self.modes)


def templates_dir() -> Path:
    """Templates ship inside the wheel as primectl/templates; in a checkout they are top-level."""
    packaged = Path(__file__).resolve().parent.parent / "templates"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parents[2] / "templates"


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
        autoescape=False, auto_reload=False,  # templates ship with primectl: no stat of each one per render
    )


def template(name: str) -> jinja2.Template:
    """One of primectl's templates (templates/NAME), strict about undefined names."""
    return _env().get_template(name)


@lru_cache(maxsize=4096)
def shell_word(value: str) -> str:
    """Quote one word for bash; the release marker becomes "${release_dir}", the pid marker "$$"."""
    return '"$$"'.join(_release_word(p) for p in value.split(PID)) or "''"


def _release_word(value: str) -> str:
    parts = value.split(RELEASE)
    return '"${release_dir}"'.join(shlex.quote(p) if p else "" for p in parts)


def _argv_lines(argv: list[str]) -> list[str]:
    """Quoted argv, one flag and its values per line, for readable run scripts."""
    lines: list[list[str]] = []
    for word in argv:
        if not lines or word.startswith("-"):
            lines.append([])
        lines[-1].append(shell_word(word))
    return [" ".join(line) for line in lines]


def unit_name(plan: Plan, service: Service) -> str:
    """systemd unit (and process-supervisor) name of a service."""
    return layout_unit_name(plan.name, service.name)


def script_path(host: HostPlan, service: Service) -> str:
    """Where the run script of `service` lives on its host (through the `current` link)."""
    return Layout(host.workdir).script(service.name)


def log_path(host: HostPlan, service: Service) -> str:
    """Where the service's output goes on its host."""
    return Layout(host.workdir).log(service.name)


def secrets_path(plan: Plan, host: HostPlan) -> str:
    """The 0600 env file with secret values, written by apply, sourced by run scripts."""
    return Layout(host.workdir).secrets(plan.name)


def render_service(plan: Plan, host: HostPlan, svc: Service) -> dict[str, str]:
    """The run script and unit of one service."""
    env = _env()
    unit = unit_name(plan, svc)
    bad = [k for k in svc.env if not ENV_NAME_RE.match(k)]
    if bad:  # names are written unquoted (`export NAME=...`); the recipe refuses these, a hand-edited plan may not
        raise ValueError(f"{svc.name}: {bad[0]!r} is not an environment variable name")
    script = env.get_template("run.sh.j2").render(
        plan=plan, service=svc, unit=unit, secrets_file=shlex.quote(secrets_path(plan, host)),
        env=[(k, shell_word(v)) for k, v in sorted(svc.env.items())], dirs=[shell_word(d) for d in svc.dirs],
        argv=_argv_lines(svc.argv), watch=" ".join(shell_word(w) for w in svc.watch), watch_env=WATCH_ENV,
    )
    after = [layout_unit_name(plan.name, d) + ".service" for d in svc.depends_on
             if plan.service(d).role in UNIT_AFTER_ROLES and plan.service(d).host == svc.host]
    unit_text = env.get_template("unit.service.j2").render(
        plan=plan, service=svc, host=host, script=script_path(host, svc), log=log_path(host, svc), after=after,
        # a service that drains gets SIGTERM on its main process alone (it winds its children down itself)
        kill_mode="mixed" if svc.drain else "control-group",
    )
    return {f"bin/{svc.name}.sh": script, f"systemd/{unit}.service": unit_text}


@lru_cache(maxsize=8)
def _generated_model(kind: str, served_name: str, max_context: int) -> tuple[tuple[str, bytes], ...]:
    if kind == "demo-tiny":
        from primectl.demo_model import demo_model_files

        return tuple((f"model/{k}", v.encode()) for k, v in demo_model_files(served_name, max_context).items())
    if kind == "tiny-qwen2":
        from primectl.tiny_model import tiny_model_files

        return tuple((f"model/{k}", v) for k, v in tiny_model_files(served_name, max_context).items())
    raise ValueError(f"no generator for model {kind!r}")


def model_files(plan: Plan) -> dict[str, bytes]:
    """The generated model directory the plan's model source asks for ({} for weights on the hosts)."""
    m = plan.serving.model
    files = dict(_generated_model(m.generate, m.served_name, m.max_context)) if m.generate else {}
    if files and m.shared_name:  # the host agent copies the directory to models/<name> when it stages the release
        files[SHARED_MODEL_MARK] = (m.shared_name + "\n").encode()
    return files


def file_bytes(spec: FileSpec) -> bytes:
    """A shipped file's content: its `content`, or for a secret the file its `source` names, read now (ValueError
    when it is gone or no longer the file the plan was made with)."""
    if spec.source is None:
        return spec.content.encode()
    try:
        with open(spec.source, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ValueError(f"{spec.path}: cannot read {spec.source}: {exc.strerror or exc}") from None
    if "sha256:" + hashlib.sha256(data).hexdigest() != spec.content:
        raise ValueError(f"{spec.path}: {spec.source} changed after the plan was made; plan again")
    return data


def render_host(plan: Plan, host: HostPlan) -> Bundle:
    """Render everything one host needs."""
    files: dict[str, bytes] = {}
    modes: dict[str, int] = {}
    services: dict[str, object] = {}
    model = model_files(plan)
    for svc in plan.services_on(host.name):
        own = {path: text.encode() for path, text in render_service(plan, host, svc).items()}
        for spec in svc.files:
            own[spec.path] = file_bytes(spec)
        mine = set(own)
        twin: dict[str, bytes] = {}
        if svc.twin is not None:  # its surge twin ships with it: started beside it only while it restarts
            twin = {path: text.encode() for path, text in render_service(plan, host, svc.twin).items()}
            twin |= {spec.path: file_bytes(spec) for spec in svc.twin.files}
            own |= twin
        if svc.role in MODEL_ROLES:
            own |= model  # a new tokenizer or config must restart the services that read it
        for path, data in own.items():
            if path in files and files[path] != data:
                raise ValueError(f"two services write different {path} on {host.name}")
            files[path] = data
            modes[path] = 0o755 if path.startswith("bin/") else 0o644
        for spec in [*svc.files, *(svc.twin.files if svc.twin else [])]:
            modes[spec.path] = spec.mode
        services[svc.name] = {
            **svc.hashes(),
            "run_fields": list(svc.run_fields()), "expect_fields": list(EXPECT_FIELDS),
            "component": svc.component, "role": svc.role,
            "unit": unit_name(plan, svc), "files": sorted(own),
            # the twin runs only while the service restarts: a twin gained or lost restarts nothing
            "files_hash": hash_files({p: files[p] for p in own if p in mine or p not in twin}),
        }
    revision = hash_files(files)[:16]
    manifest: dict[str, object] = {
        "deployment": plan.name, "namespace": plan.namespace, "host": host.name, "revision": revision,
        "supervisor": plan.supervisor, "runtime_key": plan.runtime_key, "services": services,
        "files": {p: digest(b).hex() for p, b in sorted(files.items())},
    }
    files[MANIFEST] = (json_pretty(manifest) + "\n").encode()
    modes[MANIFEST] = 0o644
    return Bundle(host.name, files, modes, revision, manifest)


SMALL_FILE = 4096  # bytes: below this, a file is a script or a config, cheap to hash and packed with a small window


def once_per_content(smallest: int) -> Callable[[Callable[[bytes], bytes]], Callable[[bytes], bytes]]:
    """`fn` of a file's content, computed once per process for content of `smallest` bytes and more: every
    host's bundle holds the same generated model files. The most recently used are kept, 64 of SMALL_FILE bytes
    and more and 256 smaller ones apart, so content every host shares stays while each host's own (its manifest, its
    scripts) comes and goes, and a host's many small files never push the big shared ones out."""

    def wrap(fn: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
        big, small = lru_cache(maxsize=64)(fn), lru_cache(maxsize=256)(fn)

        def cached(data: bytes) -> bytes:
            if len(data) < smallest:
                return fn(data)
            return big(data) if len(data) >= SMALL_FILE else small(data)

        return cached

    return wrap


@once_per_content(SMALL_FILE)  # a smaller file hashes about as fast as it is looked up
def digest(data: bytes) -> bytes:
    """sha256 of a file's content."""
    return hashlib.sha256(data).digest()


@once_per_content(0)  # setting up a compressor costs more than a look-up, however small the file
def _compressed(data: bytes) -> bytes:
    if len(data) < SMALL_FILE:  # zlib's default state (256 KiB) costs ten times more to set up than such a file to pack
        packer = zlib.compressobj(1, zlib.DEFLATED, 12, 4)
        return packer.compress(data) + packer.flush()
    return zlib.compress(data, 1)


def pack_files(files: Mapping[str, bytes], modes: Mapping[str, int]) -> bytes:
    """A release's files as the archive a host stages (`host.files.unpack_files` says its format), each file
    compressed on its own, so that content many hosts get is compressed once."""
    out = []
    for path in sorted(files):
        if "\n" in path:
            raise ValueError(f"a bundle path holds a newline: {path!r}")
        packed = _compressed(files[path])
        out.append(b"%o %d %s\n" % (modes.get(path, 0o644), len(packed), path.encode()))
        out.append(packed)
    return b"".join(out)


def hash_files(files: dict[str, bytes]) -> str:
    """One hash over paths and contents (a bundle's revision is its first 16 hex digits)."""
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode() + b"\0" + digest(files[path]))
    return h.hexdigest()


def render_plan(plan: Plan) -> dict[str, Bundle]:
    """Bundles for every host that runs at least one service."""
    return {h.name: render_host(plan, h) for h in plan.hosts if plan.services_on(h.name)}


def write_bundles(bundles: dict[str, Bundle], out: Path) -> list[Path]:
    """Write bundles under out/<host>/ (the only I/O in render); returns the paths written."""
    written: list[Path] = []
    for host, bundle in sorted(bundles.items()):
        for rel, data in sorted(bundle.files.items()):
            path = out / host / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(bundle.modes.get(rel, 0o644))
            written.append(path)
    return written

