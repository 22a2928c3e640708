#!/usr/bin/env python3
"""Re-vendor the Kubernetes CRDs primectl validates against, or check the vendored copies.

The CRDs are not on any package registry this project reaches (PyPI, Debian,
npm), so a refresh reads them from git checkouts made elsewhere:

  git clone https://github.com/ai-dynamo/dynamo          # or any clone/mirror of it
  git clone https://github.com/NVIDIA/k8s-dra-driver-gpu
  git clone https://github.com/prometheus-operator/prometheus-operator
  scripts/refresh-crds.py --dynamo-git dynamo --dynamo-ref v1.6.1 \\
                          --dra-git k8s-dra-driver-gpu --dra-ref v25.12.0 \\
                          --podmonitor-git prometheus-operator --podmonitor-ref v0.93.0 \\
                          --prometheusrule-git prometheus-operator --prometheusrule-ref v0.93.0

Bare repositories work too (files are read with `git show REF:PATH`, no work
tree needed). The script copies each CRD byte for byte into --dest (default:
shared/crds in the checkout; the files are upstream data, kept in the steering
repository's shared/ beside the checkout, never committed here) and rewrites the pins in
primectl/targets/data/crds/PROVENANCE: the resolved commit, its date, the
commit that last changed the file, and the sha256. primectl refuses a CRD
file whose sha256 differs from its pin.

  scripts/refresh-crds.py --check [--dest DIR]

verifies, without git, that every file in DIR has the sha256 PROVENANCE pins
(default: the first of shared/crds in the checkout and ../shared/crds beside it,
where CI has them, that exists).
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_DEST = ROOT / "shared" / "crds"
BESIDE = ROOT.parent / "shared" / "crds"  # the steering repository's shared/ next to the checkout (CI: read-only)
PROVENANCE = ROOT / "primectl" / "targets" / "data" / "crds" / "PROVENANCE"


@dataclass(frozen=True)
class Source:
    """One vendored CRD: where it lives upstream and its name here."""

    key: str
    repo: str
    path: str
    vendored_as: str


SOURCES = (
    Source(
        key="dynamo",
        repo="github.com/ai-dynamo/dynamo",
        path="deploy/operator/config/crd/bases/nvidia.com_dynamographdeployments.yaml",
        vendored_as="nvidia.com_dynamographdeployments.yaml",
    ),
    Source(
        key="dra",
        repo="github.com/NVIDIA/k8s-dra-driver-gpu",
        # The chart directory was renamed after v25.12.0 (dra-driver-nvidia-gpu); pass --dra-path for newer refs.
        path="deployments/helm/nvidia-dra-driver-gpu/crds/resource.nvidia.com_computedomains.yaml",
        vendored_as="resource.nvidia.com_computedomains.yaml",
    ),
    # The monitoring.yaml of a monitored recipe: for the cluster's Prometheus operator.
    Source(
        key="podmonitor",
        repo="github.com/prometheus-operator/prometheus-operator",
        path="example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
        vendored_as="monitoring.coreos.com_podmonitors.yaml",
    ),
    Source(
        key="prometheusrule",
        repo="github.com/prometheus-operator/prometheus-operator",
        path="example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
        vendored_as="monitoring.coreos.com_prometheusrules.yaml",
    ),
)


def sha256(data: bytes) -> str:
    """Hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def git(repo: pathlib.Path, *args: str) -> bytes:
    """Output of a git command run against `repo` (a work tree or a bare repository)."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True).stdout


def fetch_from_git(source: Source, repo: pathlib.Path, ref: str, path: str, dest: pathlib.Path) -> dict[str, Any]:
    """Copy one CRD out of `repo` at `ref` into `dest` and describe where it came from."""
    commit = git(repo, "rev-parse", f"{ref}^{{commit}}").decode().strip()
    data = git(repo, "show", f"{commit}:{path}")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / source.vendored_as).write_bytes(data)
    last = git(repo, "log", "-1", "--format=%H %cI", commit, "--", path).decode().split()
    return {
        "file": source.vendored_as,
        "repo": source.repo,
        "path": path,
        "ref": ref,
        "commit": commit,
        "commit_date": git(repo, "log", "-1", "--format=%cI", commit).decode().strip(),
        "file_last_changed_in": last[0] if last else None,
        "file_last_changed_at": last[1] if len(last) > 1 else None,
        "sha256": sha256(data),
    }


def read_provenance() -> dict[str, Any]:
    """The PROVENANCE record (YAML)."""
    record = yaml.safe_load(PROVENANCE.read_text(encoding="utf-8"))
    if not isinstance(record, dict) or not isinstance(record.get("files"), list):
        raise SystemExit(f"{PROVENANCE}: expected a mapping with a 'files' list")
    return record


def check(dest: pathlib.Path) -> int:
    """0 when every CRD in `dest` matches its pinned sha256, 1 (with the differences printed) otherwise."""
    bad = 0
    for entry in read_provenance()["files"]:
        path = dest / entry["file"]
        actual = sha256(path.read_bytes()) if path.exists() else "missing"
        if actual != entry["sha256"]:
            print(f"{entry['file']}: sha256 {actual}, PROVENANCE says {entry['sha256']}", file=sys.stderr)
            bad += 1
        else:
            print(f"{entry['file']}: ok ({entry['repo']} {entry['ref']} {entry['commit'][:12]})")
    return 1 if bad else 0


def main() -> int:
    """Refresh from the given checkouts, or --check the vendored files."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only verify the files in --dest against PROVENANCE")
    ap.add_argument("--dest", type=pathlib.Path, help=f"folder of CRD files (default {DEFAULT_DEST}; --check: that, else {BESIDE})")
    for source in SOURCES:
        ap.add_argument(f"--{source.key}-git", type=pathlib.Path, help=f"clone of {source.repo}")
        ap.add_argument(f"--{source.key}-ref", help="tag, branch or commit to read")
        ap.add_argument(f"--{source.key}-path", default=source.path, help=f"path in the repository (default {source.path})")
    args = ap.parse_args()
    if args.check:
        return check(args.dest or next((d for d in (DEFAULT_DEST, BESIDE) if d.is_dir()), DEFAULT_DEST))
    args.dest = args.dest or DEFAULT_DEST

    record = read_provenance() if PROVENANCE.exists() else {"files": []}
    entries = {e["file"]: e for e in record["files"]}
    refreshed = 0
    for source in SOURCES:
        repo, ref = getattr(args, f"{source.key}_git"), getattr(args, f"{source.key}_ref")
        if repo is None:
            continue
        if ref is None:
            ap.error(f"--{source.key}-git needs --{source.key}-ref")
        entry = fetch_from_git(source, repo, ref, getattr(args, f"{source.key}_path"), args.dest)
        if entry["file"] in entries and "note" in entries[entry["file"]]:
            entry["note"] = entries[entry["file"]]["note"]
        entries[entry["file"]] = entry
        refreshed += 1
        print(f"{entry['file']}: {entry['repo']} {ref} = {entry['commit'][:12]} ({entry['commit_date']}), sha256 {entry['sha256'][:16]}")
    if not refreshed:
        ap.error("nothing to do: give --KEY-git and --KEY-ref for at least one of "
                 f"{', '.join(s.key for s in SOURCES)}, or --check")
    record["files"] = [entries[s.vendored_as] for s in SOURCES if s.vendored_as in entries]
    PROVENANCE.write_text(
        "# Written by scripts/refresh-crds.py; `scripts/refresh-crds.py --check` verifies the sha256s.\n"
        + yaml.safe_dump(record, sort_keys=False, width=100),
        encoding="utf-8",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
