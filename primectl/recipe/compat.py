"""Which pinned version combinations primectl can deploy, and which are known bad."""

from __future__ import annotations

from dataclasses import dataclass

from primectl.recipe.model import Software

# Versions the engine adapters were written against (flags read from their source).
SUPPORTED: dict[str, tuple[str, ...]] = {
    "dynamo": ("1.6.1",),
    "vllm": ("0.33.0",),
    "nixl": ("1.5.1",),
    "mooncake": ("0.3.13.post1",),
    "flashinfer": ("0.7.2.post1",),
}


@dataclass(frozen=True)
class Incompatibility:
    """A combination that installs but fails at run time."""

    when: dict[str, str]
    field: str
    why: str


KNOWN_BAD: tuple[Incompatibility, ...] = (
    Incompatibility(
        when={"chat_processor": "vllm", "vllm": "0.33.0"},
        field="chat_processor",
        why="Dynamo's `--dyn-chat-processor vllm` imports modules vLLM 0.33.0 removed; use `dynamo`",
    ),
)


def check_software(sw: Software) -> list[tuple[str, str]]:
    """(field, message) for every unsupported pin or known-bad combination."""
    out: list[tuple[str, str]] = []
    values = sw.model_dump()
    for name, versions in SUPPORTED.items():
        if values[name] not in versions:
            out.append((name, f"{name} {values[name]} is not supported; supported: {', '.join(versions)}"))
    for bad in KNOWN_BAD:
        if all(str(values.get(k)) == v for k, v in bad.when.items()):
            out.append((bad.field, f"known-bad combination: {bad.why}"))
    return out
