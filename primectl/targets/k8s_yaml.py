"""Kubernetes manifests as YAML: stable bytes for the same objects (key order kept, no anchors, no wrapping)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from primectl.yamltext import SafeDumper


class _ManifestDumper(SafeDumper):
    """A safe dumper (libyaml's where there is one): multi-line strings as `|` blocks, never an anchor for a repeated object."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ManifestDumper.add_representer(str, _str)


def dump_documents(docs: Sequence[Any], header: str) -> bytes:
    """A manifest stream: `header` as comment lines, then every document after a `---`."""
    lines = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    body = "".join(
        "---\n" + yaml.dump(doc, Dumper=_ManifestDumper, sort_keys=False, default_flow_style=False, width=1 << 20,
                            allow_unicode=True)
        for doc in docs
    )
    return (lines + body).encode()
