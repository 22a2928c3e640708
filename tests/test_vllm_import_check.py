"""scripts/check_vllm_imports.py: Dynamo's `from vllm... import ...` resolved inside a vLLM wheel, read as a zip.

The first tests build small wheels in a temporary directory, one resolver rule each. The last ones run the
real checker against the real ai-dynamo 1.6.1 and vllm 0.31.0 / 0.33.0 wheels (downloaded once from the
package registry into .cache/wheels/, about 660 MB; `make wheels` does the same) and compare with the
committed results that `primectl validate` quotes.
"""

from __future__ import annotations

import json
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import check_vllm_imports as checker  # noqa: E402
import wheel_cache  # noqa: E402

DATA = REPO / "primectl" / "recipe" / "data"


def wheel(path: Path, project: str, version: str, files: dict[str, str]) -> Path:
    """A wheel with these sources and a METADATA naming project==version."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{project}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n")
        for name, text in files.items():
            zf.writestr(name, textwrap.dedent(text))
    return path


def run(tmp_path: Path, dynamo: dict[str, str], vllm: dict[str, str]) -> checker.Report:
    """Check a fake ai-dynamo wheel (dynamo/vllm/<name>) against a fake vllm 9.9.9 wheel (vllm/<name>)."""
    dynamo_files = {"dynamo/__init__.py": "", "dynamo/vllm/__init__.py": ""}
    dynamo_files |= {f"dynamo/vllm/{name}": text for name, text in dynamo.items()}
    vllm_files = {"vllm/__init__.py": ""} | {f"vllm/{name}": text for name, text in vllm.items()}
    return checker.check(
        wheel(tmp_path / "ai_dynamo-0.0.1-py3-none-any.whl", "ai_dynamo", "0.0.1", dynamo_files),
        wheel(tmp_path / "vllm-9.9.9-py3-none-any.whl", "vllm", "9.9.9", vllm_files),
    )


def failures(report: checker.Report) -> list[tuple[str, int, str | None, str]]:
    return [(p.file, p.line, p.name, p.status) for p in report.failures]


def test_a_removed_function_fails_at_its_file_and_line(tmp_path: Path) -> None:
    report = run(tmp_path, {"main.py": "import os\nfrom vllm.v1.engine.utils import get_engine_zmq_addresses, launch\n"},
                 {"v1/__init__.py": "", "v1/engine/__init__.py": "",
                  "v1/engine/utils.py": "def get_engine_zmq_bind_addresses(): ...\ndef launch(): ...\n"})
    assert failures(report) == [("dynamo/vllm/main.py", 2, "get_engine_zmq_addresses", "missing")]
    assert "vllm 9.9.9 has no `get_engine_zmq_addresses` in vllm.v1.engine.utils" in report.failures[0].detail
    assert checker.main([str(tmp_path / "ai_dynamo-0.0.1-py3-none-any.whl"), str(tmp_path / "vllm-9.9.9-py3-none-any.whl")]) == 1


def test_a_missing_module_fails_and_a_present_one_passes(tmp_path: Path) -> None:
    report = run(tmp_path, {"a.py": "import vllm.gone\nimport vllm.here as h\nfrom vllm.gone2 import x\n"}, {"here.py": ""})
    assert failures(report) == [("dynamo/vllm/a.py", 1, None, "missing"), ("dynamo/vllm/a.py", 3, "x", "missing")]


def test_every_kind_of_module_level_binding_counts(tmp_path: Path) -> None:
    vllm_mod = """
        import os.path
        import json as js
        from .sub import re_exported
        from .sub import orig as renamed
        A = 1
        B: int = 2
        (C, [D, *E]) = (3, [4, 5])
        def f(): ...
        async def g(): ...
        class K: ...
        try:
            from fast import T
        except ImportError:
            T = None
        if os.name == "nt":
            W = 1
        else:
            W = 2
        with open(__file__) as fh:
            H = 1
    """
    names = "os, js, re_exported, renamed, A, B, C, D, E, f, g, K, T, W, H"
    report = run(tmp_path, {"a.py": f"from vllm.m import {names}\n"},
                 {"m.py": vllm_mod, "sub.py": "re_exported = orig = 1\n"})
    assert report.failures == []
    assert report.imports["worker"] == len(names.split(","))


def test_submodules_of_packages_and_namespace_packages_count(tmp_path: Path) -> None:
    report = run(tmp_path, {"a.py": "from vllm.v1 import engine\nfrom vllm.ns import leaf\nfrom vllm.ns import nope\n"},
                 {"v1/__init__.py": "", "v1/engine.py": "", "ns/leaf.py": ""})
    assert failures(report) == [("dynamo/vllm/a.py", 3, "nope", "missing")]


def test_names_bound_only_for_type_checkers_do_not_exist_at_run_time(tmp_path: Path) -> None:
    report = run(tmp_path, {"a.py": "from vllm.m import Hint, Real\n"},
                 {"m.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    Hint = int\nelse:\n    Real = int\n"})
    assert failures(report) == [("dynamo/vllm/a.py", 1, "Hint", "missing")]


def test_lazy_getattr_table_is_read_and_its_targets_checked(tmp_path: Path) -> None:
    init = """
        MODULE_ATTRS = {"LLM": ".entrypoints.llm:LLM", "Gone": ".entrypoints.llm:Gone"}
        def __getattr__(name):
            if name in MODULE_ATTRS:
                module_name, attr = MODULE_ATTRS[name].split(":")
                return getattr(__import__(module_name), attr)
            raise AttributeError(name)
    """
    report = run(tmp_path, {"a.py": "from vllm import LLM\nfrom vllm import Gone\nfrom vllm import Other\n"},
                 {"__init__.py": init, "entrypoints/__init__.py": "", "entrypoints/llm.py": "class LLM: ...\n"})
    assert failures(report) == [("dynamo/vllm/a.py", 2, "Gone", "missing"), ("dynamo/vllm/a.py", 3, "Other", "missing")]
    assert "vllm.__getattr__ loads vllm.entrypoints.llm:Gone" in report.failures[0].detail


def test_getattr_comparisons_are_read_and_an_unreadable_getattr_is_unknown_not_present(tmp_path: Path) -> None:
    report = run(tmp_path, {"a.py": "from vllm.p import current_platform\nfrom vllm.e import ANYTHING\n"},
                 {"p.py": "def __getattr__(name):\n    if name == 'current_platform':\n        return 1\n    raise AttributeError\n",
                  "e.py": "def __getattr__(name):\n    return lookup(name)\n"})
    assert failures(report) == [("dynamo/vllm/a.py", 2, "ANYTHING", "unknown")]


def test_star_reexports_inside_vllm_use_all_or_public_names(tmp_path: Path) -> None:
    report = run(tmp_path, {"a.py": "from vllm.pkg import listed, public, unlisted, _private\n"},
                 {"pkg/__init__.py": "from .a import *\nfrom .b import *\n",
                  "pkg/a.py": "__all__ = ['listed']\nlisted = unlisted = 1\n", "pkg/b.py": "public = _private = 1\n"})
    assert failures(report) == [("dynamo/vllm/a.py", 1, "unlisted", "missing"), ("dynamo/vllm/a.py", 1, "_private", "missing")]


def test_compiled_extension_names_are_unknown(tmp_path: Path) -> None:
    report = run(tmp_path, {"a.py": "import vllm._C\nfrom vllm._C import op\n"}, {"_C.abi3.so": "\x7fELF"})
    assert failures(report) == [("dynamo/vllm/a.py", 2, "op", "unknown")]


def test_an_import_with_a_working_alternative_is_guarded_not_failed(tmp_path: Path) -> None:
    dynamo = """
        try:
            from vllm.utils import FlexibleArgumentParser
        except ImportError:
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        if HAS_NEW:
            from vllm.new import Thing
        else:
            from vllm.old import Thing
        if FLAG:
            from vllm.optional import Extra
        try:
            from vllm.gone import A
        except ImportError:
            from vllm.also_gone import A
    """
    report = run(tmp_path, {"a.py": dynamo},
                 {"utils/__init__.py": "", "utils/argparse_utils.py": "class FlexibleArgumentParser: ...\n", "old.py": "Thing = 1\n"})
    assert failures(report) == [("dynamo/vllm/a.py", 13, "A", "missing"), ("dynamo/vllm/a.py", 15, "A", "missing")]
    guarded = {(p.line, p.name) for p in report.problems if not p.fatal}
    assert guarded == {(3, "FlexibleArgumentParser"), (7, "Thing"), (11, "Extra")}


def test_function_bodies_type_checking_blocks_and_tests_are_not_import_time(tmp_path: Path) -> None:
    dynamo = """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from vllm.gone import Hint
        def later():
            from vllm.gone import lazy
        class Runs:
            from vllm.gone import at_import
    """
    report = run(tmp_path, {"a.py": dynamo, "tests/test_x.py": "from vllm.gone import t\n"}, {})
    assert failures(report) == [("dynamo/vllm/a.py", 8, "at_import", "missing")]


def test_chat_processor_scope_follows_the_dynamo_modules_it_imports(tmp_path: Path) -> None:
    dynamo_files = {
        "dynamo/__init__.py": "", "dynamo/vllm/__init__.py": "", "dynamo/frontend/__init__.py": "",
        "dynamo/frontend/vllm_processor.py": "from .prepost import x\nfrom vllm.ok import y\n",
        "dynamo/frontend/prepost.py": "from vllm.entrypoints.chat_utils import make_tool_call_id\n",
        "dynamo/frontend/unrelated.py": "from vllm.gone import z\n",
    }
    report = checker.check(
        wheel(tmp_path / "ai_dynamo-0.0.1-py3-none-any.whl", "ai_dynamo", "0.0.1", dynamo_files),
        wheel(tmp_path / "vllm-9.9.9-py3-none-any.whl", "vllm", "9.9.9", {"vllm/__init__.py": "", "vllm/ok.py": "y = 1\n"}),
    )
    assert [(p.scope, p.file, p.line) for p in report.failures] == [("chat_processor", "dynamo/frontend/prepost.py", 1)]
    assert report.files["chat_processor"] == 4  # vllm_processor, prepost and the packages dynamo, dynamo.frontend


# -- the real wheels ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_wheels() -> dict[str, Path]:
    """ai-dynamo 1.6.1 and vllm 0.31.0 / 0.33.0 from the package registry (cached in .cache/wheels/)."""
    return {
        "dynamo": wheel_cache.fetch("ai-dynamo", "1.6.1"),
        "0.31.0": wheel_cache.fetch("vllm", "0.31.0"),
        "0.33.0": wheel_cache.fetch("vllm", "0.33.0"),
    }


def committed(version: str) -> dict[str, object]:
    return dict(json.loads((DATA / "dynamo-1.6.1-vllm-imports.json").read_text())["vllm"][version])


def test_dynamo_1_6_1_worker_dies_at_import_with_vllm_0_33_0(real_wheels: dict[str, Path]) -> None:
    report = checker.check(real_wheels["dynamo"], real_wheels["0.33.0"])
    worker = [(p.file, p.line, p.module, p.name) for p in report.failures if p.scope == "worker"]
    assert worker == [("dynamo/vllm/embedding_worker_processes.py", 32, "vllm.v1.engine.utils", "get_engine_zmq_addresses")]
    assert report.imports["worker"] > 100 and report.files["worker"] > 80
    text = checker.render(report)
    assert text.startswith("FAIL: ai-dynamo 1.6.1 against vllm 0.33.0")
    assert "dynamo/vllm/embedding_worker_processes.py:32: from vllm.v1.engine.utils import get_engine_zmq_addresses" in text


def test_dynamo_1_6_1_imports_all_resolve_with_vllm_0_31_0(real_wheels: dict[str, Path]) -> None:
    report = checker.check(real_wheels["dynamo"], real_wheels["0.31.0"])
    assert report.failures == [], checker.render(report)
    assert checker.render(report).startswith("ok: ai-dynamo 1.6.1 against vllm 0.31.0")


@pytest.mark.parametrize("version", ["0.31.0", "0.33.0"])
def test_committed_import_results_are_what_the_checker_finds(real_wheels: dict[str, Path], version: str) -> None:
    fresh = checker.check(real_wheels["dynamo"], real_wheels[version]).to_json()
    stored = committed(version)
    assert {k: fresh[k] for k in ("ok", "files", "imports_checked", "problems")} == {
        k: stored[k] for k in ("ok", "files", "imports_checked", "problems")
    }, "rerun scripts/gen_compat.py"


def test_committed_requires_is_what_dynamos_metadata_declares(real_wheels: dict[str, Path]) -> None:
    import gen_compat

    fresh = gen_compat.render(gen_compat.requires_doc(real_wheels["dynamo"], wheel_cache.CACHE_DIR))
    assert (DATA / "dynamo-1.6.1-requires.json").read_text() == fresh, "rerun scripts/gen_compat.py"
