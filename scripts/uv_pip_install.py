#!/usr/bin/env python3
"""`uv pip install` into a venv, taking the files pip would take: the set-up's installs, several times faster.

    uv_pip_install.py UV VENV_PYTHON [uv pip install arguments...]

uv reads no pip configuration, so the settings that decide which files pip installs here are passed on
from pip's own (`python3 -m pip config list`: pip.conf files and PIP_* variables, the variable first, then
[install], then [global], as pip does): index-url, extra-index-url, find-links, no-index and constraint
(this machine's CPU torch lives in a find-links directory and is capped by a constraints file). Like pip,
uv then takes each package from whichever index has the best match (--index-strategy unsafe-best-match),
and it compiles bytecode as pip does: with PYTHONDONTWRITEBYTECODE set, a venv without .pyc files would
compile torch's and vLLM's sources again in every process that imports them.

Only the set-up uses this (Makefile, scripts/install-runtime.sh when PRIMECTL_UV is set); hosts that
primectl provisions install with pip. Standard library only.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

# pip option -> the uv pip install flag that means the same (each value of a list option becomes one flag).
LIST_OPTIONS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint"}
TRUE = {"1", "true", "yes", "on"}


def pip_config(python: str = sys.executable) -> dict[str, str]:
    """pip's effective settings for `pip install`: option -> value (the variable, else [install], else [global])."""
    try:
        out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60,
                             env=os.environ | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    by_section: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        section, dot, option = key.rpartition(".")
        if not (sep and dot):
            continue
        try:
            value = shlex.split(value)[0] if value.strip() else ""
        except (ValueError, IndexError):
            continue
        by_section.setdefault(section, {})[option] = value
    merged: dict[str, str] = {}
    for section in ("global", "install", ":env:"):  # later wins, as in pip
        merged |= by_section.get(section, {})
    return merged


def uv_flags(config: dict[str, str]) -> list[str]:
    """The uv pip install flags for pip's settings."""
    flags = ["--index-strategy", "unsafe-best-match", "--compile-bytecode"]
    no_index = config.get("no-index", "").lower() in TRUE
    if no_index:
        flags.append("--no-index")
    elif config.get("index-url"):
        flags += ["--index-url", config["index-url"]]
    for option, flag in LIST_OPTIONS.items():
        if no_index and option == "extra-index-url":
            continue  # pip reads no index at all then
        for value in config.get(option, "").split():
            flags += [flag, value]
    return flags


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    uv, python, *args = argv
    config = pip_config()
    env = dict(os.environ)
    if config.get("cert") and "SSL_CERT_FILE" not in env:
        env["SSL_CERT_FILE"] = config["cert"]
    cmd = [uv, "pip", "install", "--python", python, *uv_flags(config), *args]
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
