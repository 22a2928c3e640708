"""Tests for primectl.tiny_model (needs `tokenizers` and `jinja2`; no torch, no transformers)."""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

tokenizers = pytest.importorskip("tokenizers")
jinja2 = pytest.importorskip("jinja2")

from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from primectl.tiny_model import (  # noqa: E402
    CHAT_TEMPLATE,
    HEAD_DIM,
    TOOL_CALL_END,
    TOOL_CALL_START,
    VOCAB_SIZE,
    tiny_model_files,
    write_tiny_model,
)

REPO = Path(__file__).resolve().parents[1]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return tiny_model_files()


@pytest.fixture(scope="module")
def tok(files: dict[str, bytes]) -> Tokenizer:
    return Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))


def _render(template: str, **kw: object) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(**kw)


def _safetensors_header(blob: bytes) -> tuple[dict[str, dict[str, Any]], int]:
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + n]), 8 + n


def test_same_bytes_in_a_fresh_interpreter(files: dict[str, bytes]) -> None:
    """Byte-identical in another process too (different hash seeds, fresh tokenizer training)."""
    code = ("import hashlib, json, primectl.tiny_model as m; "
            "print(json.dumps({k: hashlib.sha256(v).hexdigest() for k, v in m.tiny_model_files().items()}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO), "PYTHONHASHSEED": "12345"},
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
    assert tiny_model_files() == files


def test_writes_every_file_and_is_a_few_megabytes(tmp_path: Path, files: dict[str, bytes]) -> None:
    write_tiny_model(tmp_path / "m")
    assert {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()} == files
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= set(files)
    assert 1_000_000 < sum(map(len, files.values())) < 5_000_000


def test_rejects_bad_args() -> None:
    with pytest.raises(ValueError):
        tiny_model_files(max_context=0)
    with pytest.raises(ValueError):
        tiny_model_files(served_name="")


def test_tokenizer_round_trips_text(tok: Tokenizer) -> None:
    for text in ("Hello, what is the weather in Paris today?", 'a < b && c > "d" \'e\'', "ünïcödé ✓ 東京 \n\t  x"):
        ids = tok.encode(text).ids
        assert tok.decode(ids, skip_special_tokens=False) == text
        assert max(ids) < VOCAB_SIZE


def test_tokenizer_was_trained(tok: Tokenizer) -> None:
    """Merges learnt from the corpus: common words are single tokens, not bytes."""
    assert len(tok.encode(" weather").ids) == 1
    assert 1000 < tok.get_vocab_size(with_added_tokens=True) <= VOCAB_SIZE


def test_tool_tokens_are_single_visible_ids(tok: Tokenizer) -> None:
    text = f'{TOOL_CALL_START}\n{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}\n{TOOL_CALL_END}'
    enc = tok.encode(text)
    start, end = tok.token_to_id(TOOL_CALL_START), tok.token_to_id(TOOL_CALL_END)
    assert enc.ids[0] == start and enc.ids[-1] == end
    assert enc.ids.count(start) == enc.ids.count(end) == 1
    # Not special: still in the text after skip_special_tokens, where Dynamo's parser looks for it.
    assert tok.decode(enc.ids, skip_special_tokens=True) == text


def test_chat_template_renders_tools_and_calls(files: dict[str, bytes]) -> None:
    cfg = json.loads(files["tokenizer_config.json"])
    assert cfg["chat_template"] == files["chat_template.jinja"].decode() == CHAT_TEMPLATE
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    out = _render(CHAT_TEMPLATE, messages=msgs, tools=[WEATHER_TOOL], add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    listed = out.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].splitlines()
    assert [json.loads(line) for line in listed] == [WEATHER_TOOL]  # the whole schema, enum included
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in out
    assert "<tool_response>\nsunny\n</tool_response>" in out
    assert out.endswith("<|im_start|>assistant\n")
    plain = _render(CHAT_TEMPLATE, messages=msgs[1:2], add_generation_prompt=False)
    assert plain == "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    assert "<tools>" not in plain


def test_config_matches_the_cpu_backend_limits(files: dict[str, bytes], tok: Tokenizer) -> None:
    cfg = json.loads(files["config.json"])
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == HEAD_DIM >= 32
    assert cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0
    assert cfg["vocab_size"] >= tok.get_vocab_size(with_added_tokens=True)
    gen = json.loads(files["generation_config.json"])
    assert tok.id_to_token(cfg["eos_token_id"]) == "<|im_end|>"
    assert cfg["eos_token_id"] in gen["eos_token_id"]


def test_safetensors_header_parses_and_shapes_match_config(files: dict[str, bytes]) -> None:
    blob = files["model.safetensors"]
    header, data_start = _safetensors_header(blob)
    assert (data_start - 8) % 8 == 0
    cfg = json.loads(files["config.json"])
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert tensors["model.embed_tokens.weight"]["shape"] == [cfg["vocab_size"], h]
    assert "lm_head.weight" not in tensors and cfg["tie_word_embeddings"] is True
    for i in range(layers):
        p = f"model.layers.{i}."
        assert tensors[p + "self_attn.q_proj.weight"]["shape"] == [h, h]
        assert tensors[p + "self_attn.k_proj.weight"]["shape"] == [kv, h]
        assert tensors[p + "self_attn.v_proj.bias"]["shape"] == [kv]
        assert tensors[p + "mlp.down_proj.weight"]["shape"] == [h, cfg["intermediate_size"]]
    assert not any(k.startswith(f"model.layers.{layers}.") for k in tensors)
    # Offsets tile the data section exactly, F32 = 4 bytes per element.
    spans: list[tuple[int, int]] = sorted((v["data_offsets"][0], v["data_offsets"][1]) for v in tensors.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(blob) - data_start
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    for v in tensors.values():
        n = 1
        for d in v["shape"]:
            n *= d
        start, end = v["data_offsets"]
        assert v["dtype"] == "F32" and end - start == 4 * n


def test_weights_are_small_random_values_and_norms_are_one(files: dict[str, bytes]) -> None:
    blob = files["model.safetensors"]
    header, base = _safetensors_header(blob)

    def floats(name: str) -> tuple[float, ...]:
        a, b = header[name]["data_offsets"]
        return struct.unpack(f"<{(b - a) // 4}f", blob[base + a : base + b])

    assert set(floats("model.norm.weight")) == {1.0}
    emb = floats("model.embed_tokens.weight")
    assert max(map(abs, emb)) <= 1 / 32 and len(set(emb)) > 10_000
