"""Text that describes the code must keep up with it (issue 20, item 7)."""

from __future__ import annotations

from pathlib import Path

import primectl.targets
import primectl.targets.base
from primectl.registry import TARGETS

REPO = Path(__file__).resolve().parent.parent


def test_the_targets_docstrings_name_every_registered_target() -> None:
    modules = [ref.partition(":")[0].rsplit(".", 1)[1] + ".py" for ref in TARGETS.values()]
    assert sorted(modules) == ["kubernetes.py", "slurm.py", "ssh.py"]
    for doc in (primectl.targets.__doc__ or "", primectl.targets.base.__doc__ or ""):
        assert [m for m in modules if m not in doc] == [], doc
        assert "first implementation" not in doc and "later" not in doc, doc


def test_launch_reference_is_cited_as_living_outside_the_repository() -> None:
    """launch-reference.md is in the shared docs, not shipped: every mention says so on its line."""
    assert not list(REPO.glob("**/launch-reference.md"))
    bare = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
            for top in ("primectl", "primectl_kernels", "docs", "scripts", "benchmarks")
            for path in sorted((REPO / top).rglob("*")) if path.suffix in (".py", ".md", ".sh")
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if "launch-reference.md" in line and "shared" not in line]
    assert bare == []
