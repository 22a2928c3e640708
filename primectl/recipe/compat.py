"""Which pinned version combinations primectl can deploy: the set Dynamo itself declares.

The table is data generated from the real wheels by scripts/gen_compat.py:

* ``data/dynamo-<v>-requires.json``: ai-dynamo's METADATA, the extra primectl installs and the pins it declares
  (the engine's packages and nixl from ai-dynamo's METADATA; the engine's own dependencies from its METADATA).

This module checks Dynamo's own pins (dynamo, nixl, mooncake); an engine checks its pins against the same table
in its `validate` (the vLLM engine: primectl/engines/vllm_compat.py). A recipe pinning anything else is refused
at validation, with what Dynamo declares.
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


def data_dir() -> Any:
    """The generated compatibility data (primectl/recipe/data)."""
    return files("primectl.recipe").joinpath("data")


@cache
def supported_dynamo() -> tuple[str, ...]:
    """Dynamo versions with a generated compatibility table."""
    found = (_REQUIRES.match(entry.name) for entry in data_dir().iterdir())
    return tuple(sorted(m["version"] for m in found if m))


@cache
def dynamo_requires(dynamo: str) -> dict[str, Any]:
    """ai-dynamo's declared version set (data/dynamo-<v>-requires.json)."""
    return dict(json.loads(data_dir().joinpath(f"dynamo-{dynamo}-requires.json").read_text()))


def declared(dynamo: str) -> dict[str, str]:
    """Recipe `software` field -> the version Dynamo's METADATA declares for it (nixl, the engine's packages...)."""
    return {name: entry["version"] for name, entry in dynamo_requires(dynamo)["declared"].items()}


def check_software(sw: Software) -> list[tuple[str, str]]:
    """(field, message) for every Dynamo pin (dynamo, nixl, mooncake) that is not the set the pinned Dynamo declares."""
    out: list[tuple[str, str]] = []
    if sw.mooncake not in MOONCAKE_SUPPORTED:
        out.append(("mooncake", f"mooncake {sw.mooncake} is not supported; supported: {', '.join(MOONCAKE_SUPPORTED)}"))
    if sw.dynamo not in supported_dynamo():
        out.insert(0, ("dynamo", f"dynamo {sw.dynamo} is not supported; supported: {', '.join(supported_dynamo())}"))
        return out
    requires = dynamo_requires(sw.dynamo)
    nixl = requires["declared"]["nixl"]
    if sw.nixl != nixl["version"]:
        out.append(("nixl", f"nixl {sw.nixl} is not the NIXL Dynamo {sw.dynamo} declares: its METADATA (extra "
                            f"`{requires['extra']}`) requires `{nixl['requirement']}`; pin nixl {nixl['version']}"))
    return out
