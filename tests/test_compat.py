"""The software pins: the defaults are the set Dynamo 1.6.1's METADATA declares, and anything else is refused
with what Dynamo declares and, when known, the import that would kill the worker."""

from __future__ import annotations

from primectl.recipe.compat import check_software, declared, import_failures, supported_dynamo
from primectl.recipe.model import Software


def test_defaults_are_the_version_set_dynamo_declares() -> None:
    sw = Software()
    want = declared(sw.dynamo)
    assert (sw.vllm, sw.nixl, sw.flashinfer) == (want["vllm"], want["nixl"], want["flashinfer"])
    assert (sw.vllm, sw.nixl, sw.flashinfer, want["torch"]) == ("0.31.0", "1.4.1", "0.7.0.post1", "2.13.0")
    assert check_software(sw) == []


def test_only_dynamo_versions_with_generated_data_are_supported() -> None:
    assert supported_dynamo() == ("1.6.1",)
    assert check_software(Software(dynamo="1.7.0")) == [("dynamo", "dynamo 1.7.0 is not supported; supported: 1.6.1")]


def test_vllm_0_33_is_refused_naming_the_missing_import() -> None:
    [(field, message)] = check_software(Software(vllm="0.33.0"))
    assert field == "vllm"
    assert "requires `vllm[flashinfer,otel,runai]==0.31.0`" in message
    assert "dynamo/vllm/embedding_worker_processes.py:32 `from vllm.v1.engine.utils import get_engine_zmq_addresses`" in message


def test_the_declared_vllm_has_no_failing_worker_or_processor_import() -> None:
    assert import_failures("1.6.1", "0.31.0", "worker") == []
    assert import_failures("1.6.1", "0.31.0", "chat_processor") == []
    assert import_failures("1.6.1", "0.29.0", "worker") is None  # never checked


def test_vllms_chat_processor_is_accepted_with_the_declared_vllm_and_refused_where_its_imports_fail() -> None:
    assert check_software(Software(chat_processor="vllm")) == []
    fields = dict(check_software(Software(vllm="0.32.0", chat_processor="vllm")))
    assert "vllm.entrypoints.chat_utils does not exist in vllm 0.32.0" in fields["chat_processor"]


def test_every_wrong_pin_is_reported_at_once() -> None:
    sw = Software(vllm="0.33.0", nixl="1.5.1", flashinfer="0.7.2.post1", mooncake="0.3.10")
    assert [field for field, _ in check_software(sw)] == ["mooncake", "vllm", "nixl", "flashinfer"]
