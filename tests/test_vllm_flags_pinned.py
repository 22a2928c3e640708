"""Every flag and value the vLLM worker adapter emits is one the pinned vLLM 0.31.0 / Dynamo 1.6.1 accepts.

The catalogs are generated from the real parsers (scripts/gen_flag_catalog.py); a flag vLLM renamed or
dropped between releases fails here instead of at worker start on a GPU host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from primectl.engines.base import get as get_engine
from primectl.engines.vllm import CATALOGS, VLLM_KV_DTYPE
from primectl.engines.vllm_compat import VllmPins
from primectl.planner.build import build_plan
from primectl.planner.load import load_recipe

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "primectl" / "recipe" / "data"
VLLM_CATALOG = json.loads((DATA / f"vllm-{VllmPins().vllm}.json").read_text())
GPU_RECIPES = ["glm53.yaml", "glm53-fp8.yaml", "bench-4rack.yaml", "glm53-tep8.yaml", "glm53-tp8-dcp4.yaml"]


def test_the_vllm_catalog_is_the_pinned_vllm() -> None:
    assert CATALOGS[0] == f"vllm-{VllmPins().vllm}.json"
    assert VLLM_CATALOG["version"] == VllmPins().vllm == "0.31.0"


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_every_worker_flag_and_value_is_accepted_by_the_pinned_parsers(recipe: str) -> None:
    plan = build_plan(load_recipe(REPO / "recipes" / recipe).recipe)
    known = get_engine("vllm").flag_catalog()
    workers = [s for s in plan.services if s.component == "dynamo-vllm"]
    assert workers
    for svc in workers:
        argv = svc.argv[svc.argv.index("dynamo.vllm") + 1 :]
        for i, token in enumerate(argv):
            if not token.startswith("--"):
                continue
            spec = known.get(token)
            assert spec is not None, f"{recipe} {svc.name}: {token} is not a vllm 0.31.0 / dynamo.vllm 1.6.1 flag"
            assert not spec["deprecated"], f"{recipe} {svc.name}: {token} is deprecated"
            if spec["choices"]:
                assert argv[i + 1] in [str(c) for c in spec["choices"]], f"{recipe} {svc.name}: {token} {argv[i + 1]}"
        structured = json.loads(argv[argv.index("--structured-outputs-config") + 1])
        assert structured["backend"] in VLLM_CATALOG["structured_outputs_backends"]
        assert svc.env["VLLM_KV_CACHE_LAYOUT"] in VLLM_CATALOG["kv_cache_layouts"]
        if "--reasoning-parser" in argv:
            assert argv[argv.index("--reasoning-parser") + 1] in VLLM_CATALOG["reasoning_parsers"]


def test_every_kv_dtype_primectl_maps_to_exists_in_the_pinned_vllm() -> None:
    assert set(VLLM_KV_DTYPE.values()) <= set(VLLM_CATALOG["kv_cache_dtypes"])
    assert "nvfp4_ds_mla" in VLLM_CATALOG["flags"]["--kv-cache-dtype"]["choices"]
