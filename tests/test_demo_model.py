"""Tests for primectl.demo_model (needs `tokenizers` and `jinja2`; no transformers)."""

from __future__ import annotations

import json
import pathlib

import pytest

tokenizers = pytest.importorskip("tokenizers")
jinja2 = pytest.importorskip("jinja2")

from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

from primectl.demo_model import (  # noqa: E402
    MOCKER_TOKEN_RANGE,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    write_demo_model,
)

FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("demo-model")
    write_demo_model(d, served_name="demo", max_context=4096)
    return d


@pytest.fixture(scope="module")
def tok(model_dir: pathlib.Path) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def test_deterministic_bytes(tmp_path: pathlib.Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    write_demo_model(a)
    write_demo_model(b)
    write_demo_model(a)  # rewrite in place is identical too
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert sorted(p.name for p in a.iterdir()) == sorted(FILES)


def test_rejects_bad_args(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError):
        write_demo_model(tmp_path, max_context=0)
    with pytest.raises(ValueError):
        write_demo_model(tmp_path, served_name="")


def test_mocker_ids_are_visible_words_that_round_trip(tok: tokenizers.Tokenizer) -> None:
    seen: set[str] = set()
    for i in MOCKER_TOKEN_RANGE:
        text = tok.decode([i], skip_special_tokens=False)
        assert text.strip(), i
        assert text.isprintable(), (i, text)
        assert text.startswith(" ") and text[1:].isalpha() and text[1:].islower(), (i, text)
        assert tok.encode(text, add_special_tokens=False).ids == [i], (i, text)
        seen.add(text)
    assert len(seen) == len(MOCKER_TOKEN_RANGE)


def test_mocker_sequence_decodes_one_word_per_id(tok: tokenizers.Tokenizer) -> None:
    ids = [1000 + (k * 37) % 1000 for k in range(200)]
    text = tok.decode(ids)
    assert len(text.split()) == len(ids)
    assert tok.encode(text, add_special_tokens=False).ids == ids


def test_special_tokens_outside_mocker_range(tok: tokenizers.Tokenizer, model_dir: pathlib.Path) -> None:
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE
    tcfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    names = [tcfg["bos_token"], tcfg["eos_token"], tcfg["pad_token"]]
    names += ["<|begin_of_text|>", "<|end_of_text|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
    names += [content for content, _ in SPECIAL_TOKENS]
    for name in names:
        tid = tok.token_to_id(name)
        assert tid is not None, name
        assert tid not in MOCKER_TOKEN_RANGE, (name, tid)
        assert tok.encode(name, add_special_tokens=False).ids == [tid], name
    for key, value in tcfg["added_tokens_decoder"].items():
        assert int(key) not in MOCKER_TOKEN_RANGE
        assert tok.id_to_token(int(key)) == value["content"]


def test_configs_consistent(model_dir: pathlib.Path, tok: tokenizers.Tokenizer) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    gen = json.loads((model_dir / "generation_config.json").read_text())
    tcfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert cfg["vocab_size"] == tok.get_vocab_size(with_added_tokens=True) == VOCAB_SIZE
    assert cfg["max_position_embeddings"] == 4096 == tcfg["model_max_length"]
    assert cfg["architectures"] and cfg["model_type"] == "llama"
    eos = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], list) else [cfg["eos_token_id"]]
    assert tok.token_to_id(tcfg["eos_token"]) in eos
    assert gen["eos_token_id"] == cfg["eos_token_id"]
    for tid in [*eos, cfg["bos_token_id"], cfg["pad_token_id"]]:
        assert tid not in MOCKER_TOKEN_RANGE and 0 <= tid < VOCAB_SIZE


def _render(model_dir: pathlib.Path, **kwargs: object) -> str:
    tcfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    # Strict: every variable the template touches must be guarded or passed.
    strict = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    out = strict.from_string(tcfg["chat_template"]).render(
        bos_token=tcfg["bos_token"], eos_token=tcfg["eos_token"], **kwargs
    )
    # Same result in an environment configured like transformers' renderer.
    hf_like = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    assert hf_like.from_string(tcfg["chat_template"]).render(bos_token=tcfg["bos_token"], **kwargs) == out
    return out


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def test_chat_template_plain(model_dir: pathlib.Path) -> None:
    out = _render(
        model_dir,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi there"},
            {"role": "user", "content": [{"type": "text", "text": "Again"}]},
        ],
        add_generation_prompt=True,
    )
    assert out == (
        "<|begin_of_text|><|system|>\nBe brief.<|end|>\n<|user|>\nHello<|end|>\n"
        "<|assistant|>\nHi there<|end|>\n<|user|>\nAgain<|end|>\n<|assistant|>\n"
    )


def test_chat_template_with_tools(model_dir: pathlib.Path, tok: tokenizers.Tokenizer) -> None:
    out = _render(
        model_dir,
        messages=[
            {"role": "system", "content": "You are a helper."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Lyon"}},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": "20C"},
        ],
        tools=TOOLS,
        add_generation_prompt=True,
    )
    assert out.startswith("<|begin_of_text|><|system|>\nYou are a helper.\n\n")
    assert "<tools>\n" in out and "</tools>" in out
    assert '"name": "get_weather"' in out and '"required": ["city"]' in out
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in out
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Lyon"}}</tool_call>' in out
    assert "<|tool|>\n<tool_response>18C, sunny</tool_response><|end|>\n" in out
    assert out.endswith("<|tool|>\n<tool_response>20C</tool_response><|end|>\n<|assistant|>\n")
    # The rendered prompt tokenises, with role markers as single special ids.
    ids = tok.encode(out, add_special_tokens=False).ids
    for marker in ("<|begin_of_text|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<tool_call>"):
        assert tok.token_to_id(marker) in ids


def test_chat_template_tools_without_system(model_dir: pathlib.Path) -> None:
    out = _render(model_dir, messages=[{"role": "user", "content": "hi"}], tools=TOOLS, add_generation_prompt=False)
    assert out.startswith("<|begin_of_text|><|system|>\nYou may call")
    assert out.endswith("<|user|>\nhi<|end|>\n")
