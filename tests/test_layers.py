"""primectl's parts sit in the layers docs/architecture.md lists (issue 38, item 6): each imports only parts of
lower layers. The list is read from the doc, so the doc and the code cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_import_graph import REPO, package_graph

DOC = REPO / "docs" / "architecture.md"


def layers(doc: Path = DOC) -> list[list[str]]:
    """The layers, lowest first, from the fenced block after the `layers:` marker."""
    text = doc.read_text()
    m = re.search(r"<!-- layers:.*?-->\s*```\n(.*?)```", text, re.S)
    assert m, f"{doc} has no layers block"
    return [line.split() for line in m.group(1).splitlines() if line.strip()]


def violations(g: dict[str, set[str]], why: dict[tuple[str, str], list[str]], order: list[list[str]]) -> list[str]:
    """Each import of a part from its own or a higher layer, and each part in no layer."""
    level = {f"primectl.{name}": i for i, layer in enumerate(order) for name in layer}
    out = [f"{p} is in no layer of docs/architecture.md" for p in sorted(g) if p not in level]
    for src, dsts in sorted(g.items()):
        for dst in sorted(dsts):
            if src in level and dst in level and level[dst] >= level[src]:
                where = "the same layer as" if level[dst] == level[src] else "a higher layer than"
                out += [f"{src} (layer {level[src]}) imports {dst}, in {where} it: {w}" for w in why[(src, dst)]]
    return out


def test_every_part_imports_only_lower_layers() -> None:
    g, why = package_graph()
    problems = violations(g, why, layers())
    assert not problems, "\n".join(problems)


def test_the_check_names_an_upward_import_and_a_part_left_out() -> None:
    g = {"primectl.plan": set(), "primectl.recipe": {"primectl.plan"}, "primectl.new": set()}
    g["primectl.plan"].add("primectl.recipe")
    why = {("primectl.plan", "primectl.recipe"): ["primectl.plan.model:7 -> primectl.recipe.model"],
           ("primectl.recipe", "primectl.plan"): ["primectl.recipe.model:3 -> primectl.plan.model"]}
    problems = violations(g, why, [["plan"], ["recipe"]])
    assert problems == ["primectl.new is in no layer of docs/architecture.md",
                        "primectl.plan (layer 0) imports primectl.recipe, in a higher layer than it: "
                        "primectl.plan.model:7 -> primectl.recipe.model"]
