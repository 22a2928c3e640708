"""The vLLM engine's pins, checked against the set Dynamo declares (primectl.recipe.compat's table).

* ``data/dynamo-<v>-requires.json``: the vllm ai-dynamo's METADATA names (its ``vllm`` extra), and the
  flashinfer-python that vllm's METADATA names.
* ``data/dynamo-<v>-vllm-imports.json``: which ``from vllm... import ...`` of Dynamo's vLLM worker and of its
  vLLM chat processor fail against each known vLLM release (scripts/check_vllm_imports.py), so a refusal can
  name the import that would kill the worker.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, ClassVar, Literal

from pydantic import Field

from primectl.recipe.compat import data_dir, dynamo_requires, supported_dynamo
from primectl.recipe.model import Strict


class VllmPins(Strict):
    """The vLLM engine's pins under `software:`."""

    # Where each sits among the `software:` fields in a dump (so a recipe hashes as it did before engines had pins).
    dump_after: ClassVar[dict[str, str]] = {"vllm": "dynamo", "flashinfer": "mooncake", "chat_processor": "flashinfer"}

    vllm: str = Field("0.31.0", description="The vLLM Dynamo's METADATA names (extra `vllm`).")
    flashinfer: str = Field("0.7.0.post1", description="The flashinfer-python that the pinned vLLM requires.")
    chat_processor: Literal["dynamo", "vllm"] = Field("dynamo", description="Dynamo's own pre/post-processor or vLLM's.")


@cache
def vllm_import_check(dynamo: str) -> dict[str, Any]:
    """Import-check results of ai-dynamo against each known vLLM (data/dynamo-<v>-vllm-imports.json)."""
    path = data_dir().joinpath(f"dynamo-{dynamo}-vllm-imports.json")
    return dict(json.loads(path.read_text())["vllm"]) if path.is_file() else {}


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


def check_vllm_pins(dynamo: str, pins: VllmPins) -> list[tuple[str, str]]:
    """(software field, message) for every vLLM pin that is not the set `dynamo` declares, or a known-bad
    combination; none when `dynamo` itself is unsupported (primectl.recipe.compat says so)."""
    if dynamo not in supported_dynamo():
        return []
    out: list[tuple[str, str]] = []
    table = dynamo_requires(dynamo)["declared"]
    if pins.vllm != table["vllm"]["version"]:
        out.append(("vllm", _vllm_message(dynamo, pins.vllm, table["vllm"])))
    if pins.flashinfer != table["flashinfer"]["version"]:
        out.append(("flashinfer", f"flashinfer {pins.flashinfer} is not the FlashInfer that vllm {table['vllm']['version']} "
                                  f"(the vLLM Dynamo {dynamo} declares) requires: `{table['flashinfer']['requirement']}`; "
                                  f"pin flashinfer {table['flashinfer']['version']}"))
    if pins.chat_processor == "vllm":
        failures = import_failures(dynamo, pins.vllm, "chat_processor")
        if failures:
            out.append(("chat_processor", f"known-bad combination: Dynamo's `--dyn-chat-processor vllm` cannot load "
                                          f"with vllm {pins.vllm}: {_failed_import(failures)}; use `dynamo`"))
    return out
