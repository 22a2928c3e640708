#!/usr/bin/env python3
"""Regenerate the version-compatibility data in primectl/recipe/data/ from Dynamo's and vLLM's own wheels.

`primectl validate` refuses a recipe whose software pins are not the set Dynamo declares, and names the import
that would fail; it reads only these committed files (no download at validation time). This script is the only
thing that writes them; it reads the wheels as zip files (METADATA and sources), never installs or imports them.

What it writes (sorted keys, byte-identical on rerun):

  dynamo-1.6.1-requires.json       ai-dynamo 1.6.1's Requires-Dist (METADATA), its `vllm` extra parsed, and the
                                   version set that extra declares: vllm and nixl from ai-dynamo's METADATA,
                                   flashinfer-python / torch / torchvision / torchaudio from the METADATA of the
                                   vllm wheel that Dynamo names.
  dynamo-1.6.1-vllm-imports.json   scripts/check_vllm_imports.py's result for ai-dynamo 1.6.1 against each vLLM in
                                   KNOWN_VLLM: which `from vllm... import ...` of the worker (dynamo/vllm/**) and
                                   of the vLLM chat processor fail, with file:line.

Run steps (needs the package registry once; the wheels are cached in .cache/wheels/, about 1.1 GB):

  python scripts/gen_compat.py            # downloads missing wheels, writes the two files
  python scripts/gen_compat.py --check    # exit 1 if the committed files differ from a fresh run

Any Python with `packaging` works (primectl's dev venv has it). To move the Dynamo pin, change DYNAMO and
rerun; KNOWN_VLLM lists the vLLM versions whose import check is recorded (the declared one is always added).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

sys.path.insert(0, str(Path(__file__).resolve().parent))

import check_vllm_imports
import wheel_cache

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = REPO / "primectl" / "recipe" / "data"
GENERATED_BY = "scripts/gen_compat.py"
DYNAMO = "1.6.1"
EXTRA = "vllm"
KNOWN_VLLM = ("0.31.0", "0.32.0", "0.33.0")
# recipe `software` field -> the package whose pin it is, and which METADATA declares it
FROM_DYNAMO = {"vllm": "vllm", "nixl": "nixl"}
FROM_VLLM = {"flashinfer": "flashinfer-python", "torch": "torch", "torchvision": "torchvision", "torchaudio": "torchaudio"}


def metadata(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA, in file order."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        text = zf.read(name).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


@functools.cache  # requires_doc and imports_doc both describe the Dynamo and the declared vLLM wheel
def _file_info(wheel: Path) -> dict[str, str]:
    with wheel.open("rb") as f:
        return {"file": wheel.name, "sha256": hashlib.file_digest(f, "sha256").hexdigest()}


def _parsed(raw: str) -> dict[str, Any]:
    req = Requirement(raw)
    pins = [s.version for s in req.specifier if s.operator == "=="]
    return {
        "requirement": raw,
        "name": req.name,
        "extras": sorted(req.extras),
        "specifier": str(req.specifier),
        "marker": str(req.marker) if req.marker else None,
        "pinned": pins[0] if len(pins) == 1 else None,
    }


def _without_marker(raw: str) -> str:
    return raw.split(";", 1)[0].strip()


def _in_extra(raw: str, extra: str) -> bool:
    req = Requirement(raw)
    return req.marker is not None and req.marker.evaluate({"extra": extra}) and not req.marker.evaluate({"extra": ""})


def _names_extra(entry: dict[str, Any]) -> bool:
    """True for a requirement that applies only with some extra."""
    return entry["marker"] is not None and "extra" in entry["marker"]


def _declared(entries: list[dict[str, Any]], package: str, by: str) -> dict[str, Any]:
    for entry in entries:
        if entry["name"] == package:
            if entry["pinned"] is None:
                raise SystemExit(f"{by} requires {entry['requirement']!r}: not an exact pin")
            return {"package": package, "version": entry["pinned"], "requirement": _without_marker(entry["requirement"]),
                    "declared_by": by}
    raise SystemExit(f"{by} does not name {package}")


def requires_doc(dynamo_wheel: Path, cache_dir: Path) -> dict[str, Any]:
    """ai-dynamo's METADATA, its vllm extra and the version set it declares (through the named vllm's METADATA)."""
    lines = metadata(dynamo_wheel)
    extra = [_parsed(raw) for raw in lines if _in_extra(raw, EXTRA)]
    base = [e for e in map(_parsed, lines) if not _names_extra(e)]
    by_dynamo = f"ai-dynamo {DYNAMO} METADATA, extra `{EXTRA}`"
    declared = {field: _declared(extra, package, by_dynamo) for field, package in FROM_DYNAMO.items()}
    vllm_version = declared["vllm"]["version"]
    vllm_wheel = wheel_cache.fetch("vllm", vllm_version, cache_dir)
    vllm_lines = [_parsed(raw) for raw in metadata(vllm_wheel)]
    vllm_base = [e for e in vllm_lines if not _names_extra(e)]
    declared |= {field: _declared(vllm_base, package, f"vllm {vllm_version} METADATA")
                 for field, package in FROM_VLLM.items()}
    return {
        "component": "ai-dynamo",
        "version": DYNAMO,
        "generated_by": GENERATED_BY,
        "wheel": _file_info(dynamo_wheel),
        "requires_dist": lines,
        "requires": base,
        "extra": EXTRA,
        "extra_requires": extra,
        "declared": declared,
        "vllm_wheel": _file_info(vllm_wheel),
    }


def imports_doc(dynamo_wheel: Path, versions: list[str], cache_dir: Path) -> dict[str, Any]:
    """The import check of ai-dynamo against each vLLM version."""
    results: dict[str, Any] = {}
    for version in versions:
        wheel = wheel_cache.fetch("vllm", version, cache_dir)
        report = check_vllm_imports.check(dynamo_wheel, wheel).to_json()
        report.pop("dynamo")
        report.pop("vllm")
        results[version] = {"wheel": _file_info(wheel), **report}
    return {
        "component": "ai-dynamo",
        "version": DYNAMO,
        "generated_by": GENERATED_BY,
        "checker": "scripts/check_vllm_imports.py",
        "wheel": _file_info(dynamo_wheel),
        "scopes": {
            "worker": f"module-level vllm imports of {check_vllm_imports.WORKER_ROOT}** (python -m dynamo.vllm)",
            "chat_processor": f"module-level vllm imports of {check_vllm_imports.CHAT_PROCESSOR_ENTRY} and the dynamo "
                              "modules it imports (--dyn-chat-processor vllm)",
        },
        "vllm": results,
    }


def render(doc: dict[str, Any]) -> str:
    """Stable JSON text."""
    return json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI: write (or --check) the two data files."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true", help="compare with the committed files; write nothing")
    ap.add_argument("--out-dir", type=Path, default=DATA_DIR)
    ap.add_argument("--wheels", type=Path, default=wheel_cache.CACHE_DIR, help="wheel cache directory")
    args = ap.parse_args(argv)
    dynamo_wheel = wheel_cache.fetch("ai-dynamo", DYNAMO, args.wheels)
    requires = requires_doc(dynamo_wheel, args.wheels)
    versions = sorted({*KNOWN_VLLM, requires["declared"]["vllm"]["version"]}, key=lambda v: tuple(map(int, v.split("."))))
    outputs = {
        f"dynamo-{DYNAMO}-requires.json": render(requires),
        f"dynamo-{DYNAMO}-vllm-imports.json": render(imports_doc(dynamo_wheel, versions, args.wheels)),
    }
    stale = []
    for name, text in outputs.items():
        path = args.out_dir / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        path.write_text(text)
        print(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {len(text)} bytes")
    if stale:
        print("out of date (rerun scripts/gen_compat.py):\n  " + "\n  ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
