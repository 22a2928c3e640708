#!/usr/bin/env python3
"""Regenerate the engine flag catalog in primectl/recipe/data/ from the pinned components' own parsers.

primectl checks a recipe's ``extra_args`` against these files, so an unknown flag is an error with a
did-you-mean. The files are data, committed to the repo; this script is the only thing that writes them.

What it writes (one file per parser set, sorted keys, byte-identical on rerun):

  vllm-0.31.0.json            ``AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())`` of vllm 0.31.0, plus
                              values the parser itself does not check: ``kv_cache_dtypes`` (vllm/config/cache.py
                              CacheDType), ``kv_cache_layouts`` (vllm/envs.py VLLM_KV_CACHE_LAYOUT choices),
                              ``reasoning_parsers`` (ReasoningParserManager) and ``structured_outputs_backends``.
  dynamo-vllm-1.6.1.json      ``python -m dynamo.vllm``'s own flags (runtime + vLLM-backend groups, stage
                              "dynamo") and its router-advertisement flags (stage "router"). Everything else
                              on that command line goes to vLLM's engine parser: see vllm-0.31.0.json.
  dynamo-mocker-1.6.1.json    ``python -m dynamo.mocker``.
  dynamo-frontend-1.6.1.json  ``python -m dynamo.frontend``.

How the parsers are obtained: every parser is built by the component's real code, imported. For the
Dynamo entry points the script calls the module's own ``parse_args`` with ``ArgumentParser.parse_known_args``
patched to capture the fully built parser and stop before anything is parsed, so the catalog follows the
same construction path as the real command line. vLLM's platform is forced to CPU first (no GPU needed),
``sys.argv`` contains ``--help`` so vLLM attaches its help text, and each component is dumped in a child
process with a scrubbed environment (Dynamo defaults read DYN_* variables; the output must not depend on
the machine that runs this).

Run steps (about 3.5 GB of scratch venv, no GPU, no CUDA torch):

  python3 -m venv .venv-flags
  .venv-flags/bin/pip install torch==2.13.0                 # CPU build; vLLM only needs torch importable
  .venv-flags/bin/pip install --no-deps vllm==0.31.0               # the vLLM ai-dynamo 1.6.1 declares
  .venv-flags/bin/pip install regex cachetools psutil sentencepiece numpy requests tqdm blake3 py-cpuinfo \\
      'transformers>=5.10.4,<5.18.0' 'huggingface_hub>=1.31.0' 'tokenizers>=0.21.1' safetensors protobuf \\
      'fastapi>=0.133.0,<0.137.0' aiohttp openai 'pydantic>=2.12.0,<=2.13.5' orjson prometheus_client pillow \\
      prometheus-fastapi-instrumentator tiktoken msgspec pyzmq pyyaml einops cloudpickle cbor2 ijson \\
      setproctitle partial-json-parser jsonschema filelock typing_extensions pybase64 python-json-logger \\
      watchfiles oss-harmony 'mcp>=2.0.0,<3' uvloop 'xgrammar==0.2.7' 'llguidance>=1.7.0,<1.8.0'
  .venv-flags/bin/pip install --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1   # aisimulate is unreachable
  .venv-flags/bin/pip install 'kubernetes>=32.0.1,<33' 'redis>=6.2.0,<9' 'zstandard>=0.23.0,<1'
  .venv-flags/bin/python scripts/gen_flag_catalog.py            # writes primectl/recipe/data/*.json
  .venv-flags/bin/python scripts/gen_flag_catalog.py --check    # exit 1 if the committed files differ

The script refuses to run against other versions than the pinned ones (change PINS to move a pin).

Each file: {"component", "version", "generated_by", "parsers": [stage, class, allow_abbrev], "flags": {...}}.
"flags" has one key per accepted option string (aliases, --no-/--disable- forms and hidden compatibility
spellings each get their own key) with: takes_value, nargs, action (store, store_true, boolean_optional, ...),
choices (null = not checked by the parser; all-string lists sorted), dest, default (JSON text of the parser
default, long values cut), required, deprecated, hidden, negative (boolean flags), env_var (Dynamo), group,
stage (dynamo.vllm: "dynamo" or "router"), aliases, and help (first paragraph, one line). -h/--help and
--version are left out.
"""

from __future__ import annotations

import argparse
import enum
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = REPO / "primectl" / "recipe" / "data"
GENERATED_BY = "scripts/gen_flag_catalog.py"
PINS = {"vllm": "0.31.0", "ai-dynamo": "1.6.1", "ai-dynamo-runtime": "1.6.1"}

# name -> (output file, component, package whose version is recorded)
TARGETS: dict[str, tuple[str, str, str]] = {
    "vllm": ("vllm-0.31.0.json", "vllm", "vllm"),
    "dynamo-vllm": ("dynamo-vllm-1.6.1.json", "dynamo.vllm", "ai-dynamo"),
    "dynamo-mocker": ("dynamo-mocker-1.6.1.json", "dynamo.mocker", "ai-dynamo"),
    "dynamo-frontend": ("dynamo-frontend-1.6.1.json", "dynamo.frontend", "ai-dynamo"),
}

# Fixed environment for the child that builds a parser: defaults must not depend on this machine.
FIXED_HOME = "/tmp/gen-flag-catalog-home"
HELP_MAX = 240
DEFAULT_MAX = 160


# --------------------------------------------------------------------------------------------------
# Child side: build one component's parser(s) and describe every option string.
# --------------------------------------------------------------------------------------------------


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


def _capture_parser(build: Any) -> argparse.ArgumentParser:
    """Run ``build()`` (a module's own parse_args) and return the first parser it tries to parse with."""
    original = argparse.ArgumentParser.parse_known_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_known_args = capture  # type: ignore[method-assign]
    try:
        build()
    except _Captured as captured:
        return captured.parser
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
    raise RuntimeError("the entry point returned without building a parser")


def _force_cpu_platform() -> None:
    # The vLLM parser builds without a GPU once the platform is CPU, as
    # ../shared/docs/launch-reference.md (outside this repository) notes.
    import vllm.platforms
    import vllm.platforms.cpu

    vllm.platforms._current_platform = vllm.platforms.cpu.CpuPlatform()


def _site_prefixes() -> list[str]:
    import site
    import sysconfig

    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], sys.prefix, *site.getsitepackages()}
    return sorted((p for p in paths if p), key=len, reverse=True)


def _clean_text(text: str) -> str:
    text = re.sub(r" at 0x[0-9a-fA-F]+", "", text)
    for prefix in _site_prefixes():
        text = text.replace(prefix, "<prefix>")
    return text


def _json_safe(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return _json_safe(value.value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_json_safe(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    return _clean_text(repr(value))


def _default_string(action: argparse.Action) -> str | None:
    """The default as a short JSON string (``null`` -> None); long reprs are cut."""
    default = action.default
    if default is None:
        return None
    if default == argparse.SUPPRESS:
        return "==SUPPRESS=="
    text = json.dumps(_json_safe(default), sort_keys=True, ensure_ascii=False)
    return text if len(text) <= DEFAULT_MAX else text[: DEFAULT_MAX - 3] + "..."


_HELP_STOP = re.compile(r"^\s*(env var:|deprecating flag:|[-*] |\w[\w.]*: |API docs:)")


def _first_line(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help's first line as one line: its first paragraph (vLLM wraps docstrings at ~80 columns), stopping
    at Dynamo's "env var: ..." trailer or a list, cut after a sentence when long. No "(default: ...)" suffix."""
    raw = action.help
    if not raw or raw == argparse.SUPPRESS:
        return ""
    params: dict[str, Any] = dict(vars(action), prog=parser.prog)
    for name in list(params):
        if params[name] is argparse.SUPPRESS:
            del params[name]
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    try:
        text = str(raw) % params
    except (KeyError, TypeError, ValueError):
        text = str(raw)
    lines: list[str] = []
    for line in _clean_text(text).strip().splitlines():
        if not line.strip() or (lines and _HELP_STOP.match(line)):
            break
        lines.append(line.strip())
    out = " ".join(" ".join(lines).split())
    if len(out) > HELP_MAX:
        cut = out.rfind(". ", 0, HELP_MAX - 3)
        out = out[: cut + 1] if cut > HELP_MAX // 3 else out[: HELP_MAX - 3] + "..."
    return out


def _choices(action: argparse.Action) -> list[Any] | None:
    """Choices as a list. All-string lists are sorted: Dynamo's parser names come from a Rust hash map whose
    order changes from one process to the next."""
    if action.choices is None:
        return None
    items = [_json_safe(c) for c in action.choices]
    return sorted(items) if all(isinstance(c, str) for c in items) else items


def _env_var(action: argparse.Action) -> str | None:
    # Dynamo's add_argument() appends "env var: DYN_X | default: ..." to every flag it declares.
    match = re.search(r"env var: ([A-Z0-9_]+)", str(action.help or ""))
    return match.group(1) if match else None


def _kind(action: argparse.Action) -> str:
    names = {
        "_StoreAction": "store",
        "_StoreTrueAction": "store_true",
        "_StoreFalseAction": "store_false",
        "_StoreConstAction": "store_const",
        "_AppendAction": "append",
        "_AppendConstAction": "append_const",
        "_CountAction": "count",
        "_ExtendAction": "extend",
        "BooleanOptionalAction": "boolean_optional",
        "EnableDisableAction": "boolean_optional",
    }
    for cls in type(action).__mro__:
        if cls.__name__ in names:
            return names[cls.__name__]
    return type(action).__name__


def _option_strings(parser: argparse.ArgumentParser, action: argparse.Action) -> tuple[list[str], set[str]]:
    """All option strings the parser accepts for ``action`` (visible first) and the hidden ones."""
    visible = list(action.option_strings)
    registered = {s for s, a in parser._option_string_actions.items() if a is action}
    # vLLM's EnableDisableAction keeps --no-enable-x registered but out of option_strings (hidden from help).
    registered |= set(getattr(action, "negative_option_strings", ()))
    hidden = registered - set(visible)
    return visible + sorted(hidden), hidden


_DEPRECATED_HELP = re.compile(r"^\W*deprecated\b|\bis deprecated\b", re.IGNORECASE)


def _is_deprecated(parser: argparse.ArgumentParser, action: argparse.Action) -> bool:
    """Marked deprecated in argparse (3.13 kwarg, vLLM's _deprecated set, Dynamo's DeprecatedAction) or
    announced as such at the start of its help ("DEPRECATED: use ...", "--x is deprecated ...")."""
    help_text = "" if action.help in (None, argparse.SUPPRESS) else str(action.help)
    return bool(
        getattr(action, "deprecated", False)
        or action in getattr(parser, "_deprecated", ())
        or "Deprecated" in type(action).__name__
        or _DEPRECATED_HELP.search(help_text.split("\n", 1)[0])
    )


def _describe(parser: argparse.ArgumentParser, action: argparse.Action, group: str, **extra: Any) -> dict[str, Any]:
    aliases, hidden = _option_strings(parser, action)
    negatives = set(getattr(action, "negative_option_strings", ()))
    if _kind(action) == "boolean_optional" and not negatives:
        negatives = {s for s in aliases if s.startswith("--no-")}
    nargs = action.nargs
    base = {
        "takes_value": nargs != 0,
        "nargs": nargs,
        "action": _kind(action),
        "choices": _choices(action),
        "dest": action.dest,
        "default": _default_string(action),
        "required": bool(action.required),
        "deprecated": _is_deprecated(parser, action),
        "env_var": _env_var(action),
        "group": group,
        "help": _first_line(parser, action),
        "aliases": aliases,
        **extra,
    }
    out = {}
    for opt in aliases:
        entry = dict(base)
        entry["hidden"] = opt in hidden or action.help == argparse.SUPPRESS
        if base["action"] == "boolean_optional" or base["action"] in ("store_true", "store_false"):
            entry["negative"] = opt in negatives
        out[opt] = entry
    return out


def _dump_groups(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """Describe every optional action of ``parser``, by argparse group; help/version actions are left out."""
    flags: dict[str, dict[str, Any]] = {}
    seen: set[int] = set()
    for grp in parser._action_groups:
        for action in grp._group_actions:
            if not action.option_strings or id(action) in seen:
                continue
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            seen.add(id(action))
            flags.update(_describe(parser, action, grp.title or ""))
    return flags


def _parser_info(parser: argparse.ArgumentParser, stage: str) -> dict[str, Any]:
    return {"stage": stage, "class": type(parser).__name__, "allow_abbrev": parser.allow_abbrev}


def _dump_vllm() -> dict[str, Any]:
    import typing

    _force_cpu_platform()
    import vllm.envs
    from vllm.config.cache import CacheDType
    from vllm.config.structured_outputs import StructuredOutputsBackend
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.reasoning import ReasoningParserManager
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    # VLLM_KV_CACHE_LAYOUT is declared as env_with_choices("VLLM_KV_CACHE_LAYOUT", None, [...]) in vllm/envs.py;
    # the choices live only in that call, so read them from the source of the installed module.
    match = re.search(
        r'"VLLM_KV_CACHE_LAYOUT": env_with_choices\(\s*"VLLM_KV_CACHE_LAYOUT",\s*\w+,\s*\[([^\]]*)\]',
        Path(vllm.envs.__file__).read_text(),
    )
    if not match:
        raise RuntimeError("VLLM_KV_CACHE_LAYOUT choices not found in vllm/envs.py")
    return {
        "flags": _dump_groups(parser),
        "parsers": [_parser_info(parser, "engine")],
        # Values the parser does not check itself (type=str, no choices); the engine rejects others later.
        "kv_cache_dtypes": list(typing.get_args(CacheDType)),
        "kv_cache_layouts": re.findall(r'"([^"]+)"', match.group(1)),
        "reasoning_parsers": sorted(ReasoningParserManager.list_registered()),
        "structured_outputs_backends": list(typing.get_args(StructuredOutputsBackend)),
    }


def _dump_dynamo_vllm() -> dict[str, Any]:
    _force_cpu_platform()
    import dynamo.vllm.args as dargs
    from dynamo.common.configuration.groups.router_args import add_worker_router_arguments

    parser = _capture_parser(lambda: dargs.parse_args([]))
    # The router flags are parsed by their own parser (parse_worker_router_config); rebuild it the same way
    # so hidden strings and allow_abbrev are those of the parser that really parses them.
    router = argparse.ArgumentParser(add_help=False)
    add_worker_router_arguments(router)
    router_by_dest = {a.dest: a for a in router._actions if a.option_strings}
    flags: dict[str, dict[str, Any]] = {}
    for grp in parser._action_groups:
        title = grp.title or ""
        if title.startswith("vLLM Engine Options"):
            continue  # vLLM's own engine flags: vllm-0.31.0.json
        for action in grp._group_actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            if title.startswith("Router Advertisement Options"):
                flags.update(_describe(router, router_by_dest[action.dest], title, stage="router"))
            else:
                flags.update(_describe(parser, action, title, stage="dynamo"))
    return {
        "flags": flags,
        "parsers": [
            _parser_info(parser, "dynamo"),
            _parser_info(router, "router"),
            {"stage": "engine", "class": "FlexibleArgumentParser", "allow_abbrev": True, "catalog": "vllm-0.31.0.json"},
        ],
    }


def _dump_mocker() -> dict[str, Any]:
    import dynamo.mocker.args as margs

    parser = _capture_parser(lambda: margs.parse_args([]))
    return {"flags": _dump_groups(parser), "parsers": [_parser_info(parser, "mocker")]}


def _dump_frontend() -> dict[str, Any]:
    import dynamo.frontend.main as fmain

    parser = _capture_parser(fmain.parse_args)
    return {"flags": _dump_groups(parser), "parsers": [_parser_info(parser, "frontend")]}


DUMPERS = {
    "vllm": _dump_vllm,
    "dynamo-vllm": _dump_dynamo_vllm,
    "dynamo-mocker": _dump_mocker,
    "dynamo-frontend": _dump_frontend,
}


def _child(target: str) -> None:
    # vLLM attaches per-flag help text only when "--help" is on the command line (arg_utils.NEEDS_HELP).
    sys.argv = ["gen_flag_catalog", "--help"]
    import logging

    logging.disable(logging.CRITICAL)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # keep import-time chatter out of the JSON
    try:
        data = DUMPERS[target]()
    finally:
        sys.stdout = real_stdout
    real_stdout.write(json.dumps(data, sort_keys=True))


# --------------------------------------------------------------------------------------------------
# Parent side: run one child per target, assemble and write the files.
# --------------------------------------------------------------------------------------------------


def _check_pins() -> None:
    for pkg, want in PINS.items():
        try:
            have = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            sys.exit(f"{pkg}=={want} is not installed in {sys.prefix}; see the run steps in this script's docstring")
        if have != want:
            sys.exit(f"{pkg} {have} is installed, the catalog pins {want}")


def _child_env(target: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": FIXED_HOME,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "COLUMNS": "120",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if target == "vllm":
        # Plain vLLM: load no vllm.general_plugins entry points (ai-dynamo registers one in this venv).
        env["VLLM_PLUGINS"] = ""
    return env


def _build(target: str) -> dict[str, Any]:
    _filename, component, package = TARGETS[target]
    os.makedirs(FIXED_HOME, exist_ok=True)
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", target],
            cwd=cwd,
            env=_child_env(target),
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-6000:])
        sys.exit(f"building the {target} parser failed (exit {proc.returncode})")
    data = json.loads(proc.stdout)
    doc: dict[str, Any] = {
        "component": component,
        "version": importlib.metadata.version(package),
        "generated_by": GENERATED_BY,
        **data,
    }
    if target.startswith("dynamo"):
        doc["runtime_version"] = importlib.metadata.version("ai-dynamo-runtime")
    return doc


def _render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true", help="compare with the files on disk; write nothing")
    ap.add_argument("--out-dir", type=Path, default=DATA_DIR)
    ap.add_argument("--only", choices=sorted(TARGETS), action="append", help="regenerate only these targets")
    ap.add_argument("--child", choices=sorted(TARGETS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child)
        return 0
    _check_pins()
    stale = []
    for target in args.only or sorted(TARGETS):
        filename = TARGETS[target][0]
        text = _render(_build(target))
        path = args.out_dir / filename
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        flags = json.loads(text)["flags"]
        print(
            f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {len(flags)} option strings, "
            f"{len(text)} bytes"
        )
    if stale:
        print("out of date (rerun scripts/gen_flag_catalog.py):\n  " + "\n  ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
