"""Which pinned version combinations primectl can deploy: the set Dynamo itself declares.

The table is data generated from the real wheels by scripts/gen_compat.py:

* ``data/dynamo-<v>-requires.json``: ai-dynamo's METADATA, its ``vllm`` extra and the pins it declares
  (vllm and nixl from ai-dynamo's METADATA; flashinfer-python and torch from the METADATA of that vllm).
* ``data/dynamo-<v>-vllm-imports.json``: which ``from vllm... import ...`` of Dynamo's vLLM worker and of its
  vLLM chat processor fail against each known vLLM release (scripts/check_vllm_imports.py), so a refusal can
  name the import that would kill the worker.

A recipe pinning anything else is refused at validation, with what Dynamo declares.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib.resources import files
from typing import Any

from primectl.recipe.model import Software

# Not declared by Dynamo: the Mooncake release primectl's host tier was written and tested against.
MOONCAKE_SUPPORTED = ("0.3.13.post1",)
_REQUIRES = re.compile(r"^dynamo-(?P<version>.+)-requires\.json$")


def _data() -> Any:
    return files("primectl.recipe").joinpath("data")


@cache
def supported_dynamo() -> tuple[str, ...]:
    """Dynamo versions with a generated compatibility table."""
    found = (_REQUIRES.match(entry.name) for entry in _data().iterdir())
    return tuple(sorted(m["version"] for m in found if m))


@cache
def dynamo_requires(dynamo: str) -> dict[str, Any]:
    """ai-dynamo's declared version set (data/dynamo-<v>-requires.json)."""
    return dict(json.loads(_data().joinpath(f"dynamo-{dynamo}-requires.json").read_text()))


@cache
def vllm_import_check(dynamo: str) -> dict[str, Any]:
    """Import-check results of ai-dynamo against each known vLLM (data/dynamo-<v>-vllm-imports.json)."""
    path = _data().joinpath(f"dynamo-{dynamo}-vllm-imports.json")
    return dict(json.loads(path.read_text())["vllm"]) if path.is_file() else {}


def declared(dynamo: str) -> dict[str, str]:
    """Recipe `software` field -> the version Dynamo's METADATA declares for it (vllm, nixl, flashinfer, torch...)."""
    return {name: entry["version"] for name, entry in dynamo_requires(dynamo)["declared"].items()}


def import_failures(dynamo: str, vllm: str, scope: str) -> list[dict[str, Any]] | None:
    """The recorded imports of `scope` ("worker" or "chat_processor") that fail with this vLLM; None if unchecked."""
    result = vllm_import_check(dynamo).get(vllm)
    if result is None:
        return None
    return [p for p in result["problems"] if p["scope"] == scope and p["fatal"]]


def _failed_import(problems: list[dict[str, Any]]) -> str:
    first = problems[0]
    what = f"from {first['module']} import {first['name']}" if first["name"] else f"import {first['module']}"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{first['file']}:{first['line']} `{what}`: {first['detail']}{more}"


def _vllm_message(dynamo: str, vllm: str, want: dict[str, Any]) -> str:
    text = (f"vllm {vllm} is not the vLLM Dynamo {dynamo} declares: its METADATA (extra `vllm`) requires "
            f"`{want['requirement']}`; pin vllm {want['version']}")
    failures = import_failures(dynamo, vllm, "worker")
    if failures is None:
        return text + f" (no import check recorded for vllm {vllm}; see scripts/check_vllm_imports.py)"
    if failures:
        return text + f". With vllm {vllm}, `python -m dynamo.vllm` dies at import: {_failed_import(failures)}"
    return text


def check_software(sw: Software) -> list[tuple[str, str]]:
    """(field, message) for every pin that is not the set the pinned Dynamo declares, or a known-bad combination."""
    out: list[tuple[str, str]] = []
    if sw.mooncake not in MOONCAKE_SUPPORTED:
        out.append(("mooncake", f"mooncake {sw.mooncake} is not supported; supported: {', '.join(MOONCAKE_SUPPORTED)}"))
    if sw.dynamo not in supported_dynamo():
        out.insert(0, ("dynamo", f"dynamo {sw.dynamo} is not supported; supported: {', '.join(supported_dynamo())}"))
        return out
    table = dynamo_requires(sw.dynamo)["declared"]
    if sw.vllm != table["vllm"]["version"]:
        out.append(("vllm", _vllm_message(sw.dynamo, sw.vllm, table["vllm"])))
    if sw.nixl != table["nixl"]["version"]:
        out.append(("nixl", f"nixl {sw.nixl} is not the NIXL Dynamo {sw.dynamo} declares: its METADATA (extra `vllm`) "
                            f"requires `{table['nixl']['requirement']}`; pin nixl {table['nixl']['version']}"))
    if sw.flashinfer != table["flashinfer"]["version"]:
        out.append(("flashinfer", f"flashinfer {sw.flashinfer} is not the FlashInfer that vllm {table['vllm']['version']} "
                                  f"(the vLLM Dynamo {sw.dynamo} declares) requires: `{table['flashinfer']['requirement']}`; "
                                  f"pin flashinfer {table['flashinfer']['version']}"))
    if sw.chat_processor == "vllm":
        failures = import_failures(sw.dynamo, sw.vllm, "chat_processor")
        if failures:
            out.append(("chat_processor", f"known-bad combination: Dynamo's `--dyn-chat-processor vllm` cannot load "
                                          f"with vllm {sw.vllm}: {_failed_import(failures)}; use `dynamo`"))
    return out
