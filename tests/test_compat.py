"""The software pins: the defaults are the set Dynamo 1.6.1's METADATA declares, and anything else is refused
with what Dynamo declares and, when known, the import that would kill the worker.

Dynamo's own pins (dynamo, nixl, mooncake) are checked by primectl.recipe.compat; the vLLM engine's (vllm,
flashinfer, chat_processor) by the engine (primectl.engines.vllm_compat, from its `validate`)."""

from __future__ import annotations

from primectl.engines.vllm_compat import VllmPins, check_vllm_pins, import_failures
from primectl.recipe.compat import check_software, declared, supported_dynamo
from primectl.recipe.model import Software


def test_defaults_are_the_version_set_dynamo_declares() -> None:
    sw, vp = Software(), VllmPins()
    want = declared(sw.dynamo)
    assert (vp.vllm, sw.nixl, vp.flashinfer) == (want["vllm"], want["nixl"], want["flashinfer"])
    assert (vp.vllm, sw.nixl, vp.flashinfer, want["torch"]) == ("0.31.0", "1.4.1", "0.7.0.post1", "2.13.0")
    assert check_software(sw) == []
    assert check_vllm_pins(sw.dynamo, vp) == []


def test_only_dynamo_versions_with_generated_data_are_supported() -> None:
    assert supported_dynamo() == ("1.6.1",)
    assert check_software(Software(dynamo="1.7.0")) == [("dynamo", "dynamo 1.7.0 is not supported; supported: 1.6.1")]
    assert check_vllm_pins("1.7.0", VllmPins(vllm="0.33.0")) == []  # the dynamo refusal says it all


def test_vllm_0_33_is_refused_naming_the_missing_import() -> None:
    [(field, message)] = check_vllm_pins("1.6.1", VllmPins(vllm="0.33.0"))
    assert field == "vllm"
    assert "requires `vllm[flashinfer,otel,runai]==0.31.0`" in message
    assert "dynamo/vllm/embedding_worker_processes.py:32 `from vllm.v1.engine.utils import get_engine_zmq_addresses`" in message


def test_the_declared_vllm_has_no_failing_worker_or_processor_import() -> None:
    assert import_failures("1.6.1", "0.31.0", "worker") == []
    assert import_failures("1.6.1", "0.31.0", "chat_processor") == []
    assert import_failures("1.6.1", "0.29.0", "worker") is None  # never checked


def test_vllms_chat_processor_is_accepted_with_the_declared_vllm_and_refused_where_its_imports_fail() -> None:
    assert check_vllm_pins("1.6.1", VllmPins(chat_processor="vllm")) == []
    fields = dict(check_vllm_pins("1.6.1", VllmPins(vllm="0.32.0", chat_processor="vllm")))
    assert "vllm.entrypoints.chat_utils does not exist in vllm 0.32.0" in fields["chat_processor"]


def test_every_wrong_pin_is_reported_at_once() -> None:
    assert [field for field, _ in check_software(Software(nixl="1.5.1", mooncake="0.3.10"))] == ["mooncake", "nixl"]
    pins = VllmPins(vllm="0.33.0", flashinfer="0.7.2.post1")
    assert [field for field, _ in check_vllm_pins("1.6.1", pins)] == ["vllm", "flashinfer"]
