#!/usr/bin/env python3
"""Download release wheels once into a cache directory (default: .cache/wheels/) with pip, no dependencies.

Used by scripts/gen_compat.py, scripts/lock-cuda.sh and the import-check test, so all of them read the very
same files. The wheels are read as zip files, never installed, so the platform is fixed
(manylinux_2_28_x86_64, CPython 3.11): the same wheel on every machine that runs this.

This machine's pip prefers a local CPU build of torch (PIP_FIND_LINKS, a pip config file with a constraints
file): those settings are cleared for the download, so the wheel comes from the package registry.

Usage: wheel_cache.py [--dir DIR] PROJECT==VERSION ...   (prints the path of each wheel)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO / ".cache" / "wheels"
PLATFORM = "manylinux_2_28_x86_64"
PYTHON_VERSION = "3.11"


def registry_env() -> dict[str, str]:
    """The environment with this machine's local-wheel pip settings removed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_NO_INDEX")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def _normalise(project: str) -> str:
    return project.lower().replace("-", "_").replace(".", "_")


def cached(project: str, version: str, cache_dir: Path = CACHE_DIR) -> Path | None:
    """The cached wheel of project==version, if it is there."""
    prefix = f"{_normalise(project)}-{version}-"
    hits = sorted(p for p in cache_dir.glob("*.whl") if p.name.lower().startswith(prefix))
    return hits[0] if hits else None


def fetch(project: str, version: str, cache_dir: Path = CACHE_DIR) -> Path:
    """The wheel of project==version, downloaded from the package registry on first use."""
    hit = cached(project, version, cache_dir)
    if hit:
        return hit
    cache_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--only-binary=:all:", "--platform", PLATFORM, "--python-version", PYTHON_VERSION,
         "--dest", str(cache_dir), f"{project}=={version}"],
        check=True, env=registry_env(),
    )
    hit = cached(project, version, cache_dir)
    if hit is None:
        raise FileNotFoundError(f"pip downloaded no wheel for {project}=={version} into {cache_dir}")
    return hit


def main(argv: list[str] | None = None) -> int:
    """CLI: fetch each PROJECT==VERSION and print its path."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    ap.add_argument("--dir", type=Path, default=CACHE_DIR)
    ap.add_argument("specs", nargs="+", metavar="PROJECT==VERSION")
    args = ap.parse_args(argv)
    for spec in args.specs:
        project, sep, version = spec.partition("==")
        if not sep:
            ap.error(f"{spec}: expected PROJECT==VERSION")
        print(fetch(project, version, args.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
