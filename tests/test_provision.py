"""Which pinned runtime a host gets, and how drift against the pins is read from pip freeze."""

from pathlib import Path

from primectl.deploy.provision import drift, lock_file
from primectl.planner.build import build_plan
from primectl.planner.load import load_recipe

REPO = Path(__file__).resolve().parents[1]


def plan_of(name: str):
    return build_plan(load_recipe(REPO / "recipes" / name).recipe)


def lock_pins(path: Path) -> dict[str, str]:
    """name -> version of a lock (`name==version` lines, hash continuation lines skipped)."""
    pins = {}
    for line in path.read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith(("#", " ")):
            pins[name.strip().lower()] = version.split()[0]
    return pins


def runtime(plan):
    return next(iter(plan.serving.runtime.values()))


def test_cpu_demo_installs_the_cpu_lock_and_gpu_recipe_the_cuda_lock():
    assert lock_file(runtime(plan_of("demo.yaml"))).name == "runtime-requirements-cpu.txt"
    assert lock_file(runtime(plan_of("glm53.yaml"))).name == "runtime-requirements-cuda.txt"


def test_gpu_lock_is_the_cuda_build_of_the_version_set_dynamo_declares():
    cuda = lock_file(runtime(plan_of("glm53.yaml")))
    pins = lock_pins(cuda)
    assert pins["torch"] == "2.13.0"  # the registry's CUDA build, never this machine's local +cpu wheel
    assert "+cpu" not in cuda.read_text()
    assert pins["vllm"] == "0.31.0" and pins["flashinfer-python"] == "0.7.0.post1"
    assert pins["nixl"] == "1.4.1" and pins["nixl-cu13"] == "1.4.1"
    assert "aisimulate" not in pins
    assert pins["ai-dynamo"] == pins["ai-dynamo-runtime"] == "1.6.1"
    assert any(name.startswith("nvidia-") and name.endswith("-cu13") for name in pins)


def test_gpu_lock_has_one_sha256_per_package_so_pip_installs_exactly_those_files():
    text = lock_file(runtime(plan_of("glm53.yaml"))).read_text()
    entries = [e for e in text.split("\n") if e and not e.startswith(("#", " "))]
    hashes = [e for e in text.split("\n") if e.startswith("    --hash=sha256:")]
    assert len(entries) == len(hashes) == len(lock_pins(lock_file(runtime(plan_of("glm53.yaml"))))) > 200


def test_gpu_lock_matches_the_recipe_pins_so_a_fresh_runtime_shows_no_drift():
    plan = plan_of("glm53.yaml")
    freeze = "\n".join(f"{name}=={version}" for name, version in lock_pins(lock_file(runtime(plan))).items())
    assert drift(plan, freeze) == {}


def test_gpu_lock_input_names_every_requirement_ai_dynamo_declares_for_vllm():
    import json

    from packaging.requirements import Requirement

    declared = json.loads((REPO / "primectl/recipe/data/dynamo-1.6.1-requires.json").read_text())
    wanted = [e for e in declared["requires"] + declared["extra_requires"] if e["name"] not in ("aisimulate", "ai-dynamo-runtime")]
    lines = (REPO / "scripts/runtime-requirements-cuda.in").read_text().splitlines()
    given = {Requirement(line).name: Requirement(line) for line in lines if line and not line.startswith("#")}
    for entry in wanted:
        assert entry["name"] in given, entry["requirement"]
        assert str(given[entry["name"]].specifier) == entry["specifier"] or entry["specifier"] == "", entry["requirement"]
        assert set(entry["extras"]) <= given[entry["name"]].extras, entry["requirement"]


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
    lock = lock_file(runtime(plan)).read_text()
    assert drift(plan, lock) == {}


def test_gpu_lock_satisfies_every_line_of_its_input():
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = lock_pins(lock_file(runtime(plan_of("glm53.yaml"))))
    for line in (REPO / "scripts/runtime-requirements-cuda.in").read_text().splitlines():
        if line and not line.startswith("#"):
            req = Requirement(line)
            name = canonicalize_name(req.name)
            assert name in pins and req.specifier.contains(pins[name], prereleases=True), (line, pins.get(name))
