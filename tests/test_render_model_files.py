"""The generated model directory is part of what the services reading it run with."""

from pathlib import Path

from primectl.planner.build import build_plan
from primectl.planner.load import load_recipe
from primectl.render.bundle import render_plan

REPO = Path(__file__).resolve().parents[1]


def test_changing_the_generated_model_restarts_its_readers_only():
    plan = build_plan(load_recipe(REPO / "recipes" / "demo.yaml").recipe)
    assert plan.serving.model.generate == "demo-tiny" and plan.serving.model.max_context == 262144
    # the same plan, except for the context length its generated model declares
    model = plan.serving.model.model_copy(update={"max_context": 16384})
    other = plan.model_copy(update={"serving": plan.serving.model_copy(update={"model": model})})
    a = render_plan(plan)["local"].manifest["services"]
    b = render_plan(other)["local"].manifest["services"]
    changed = {name for name in a if a[name]["files_hash"] != b[name]["files_hash"]}
    assert changed == {"prefill-0", "decode-0", "decode-1", "frontend"}
    assert all(a[n]["hash"] == b[n]["hash"] for n in a), "the service definitions themselves did not change"
