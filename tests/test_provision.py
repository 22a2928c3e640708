"""Which pinned runtime a host gets, and how drift against the pins is read from pip freeze."""

from pathlib import Path

from primectl.deploy.provision import drift, lock_file
from primectl.plan.build import build_plan
from primectl.recipe.load import load_recipe

REPO = Path(__file__).resolve().parents[1]


def plan_of(name: str):
    return build_plan(load_recipe(REPO / "recipes" / name).recipe)


def test_cpu_demo_installs_the_full_lock_and_gpu_recipe_the_cuda_pins():
    assert lock_file(plan_of("demo.yaml")).name == "runtime-requirements-cpu.txt"
    cuda = lock_file(plan_of("glm53.yaml"))
    assert cuda.name == "runtime-requirements-cuda.in"
    assert "vllm==0.33.0" in cuda.read_text() and "flashinfer-python==0.7.2.post1" in cuda.read_text()


def test_runtime_venv_name_changes_with_the_pins():
    assert plan_of("demo.yaml").runtime_key != plan_of("glm53.yaml").runtime_key


def test_drift_names_each_pin_that_differs_or_is_missing():
    plan = plan_of("demo.yaml")
    freeze = "ai-dynamo==1.6.1\nai-dynamo-runtime==1.6.0\nnixl-cu12==1.4.1\n"
    assert drift(plan, freeze) == {
        "ai-dynamo-runtime": ("1.6.1", "1.6.0"),
        "mooncake-transfer-engine": ("0.3.13.post1", None),
    }


def test_no_drift_on_the_lock_itself():
    plan = plan_of("demo.yaml")
    lock = lock_file(plan).read_text()
    assert drift(plan, lock) == {}
