"""A tiny random-weight Qwen2 model that a real vLLM serves on CPU (no hub, no torch).

:func:`tiny_model_files` returns the whole model directory as
``{relative file name: bytes}``; :func:`write_tiny_model` writes it. About 2 MB:

* ``config.json`` - ``Qwen2ForCausalLM``, 2 layers, hidden 128, 4 attention
  heads of size 32 (vLLM's CPU attention backend needs head size >= 32), 2 KV
  heads, float32, tied embeddings.
* ``model.safetensors`` - random weights, written here without torch or numpy:
  an 8-byte little-endian header length, a JSON header (padded with spaces to
  a multiple of 8), then the raw little-endian float32 data.
* ``tokenizer.json`` - a byte-level BPE tokenizer *trained* with the
  ``tokenizers`` library on text generated here, plus the ChatML special
  tokens and ``<tool_call>`` / ``</tool_call>`` as (non-special, so visible in
  decoded text) added tokens.
* ``tokenizer_config.json`` and ``chat_template.jinja`` - a Hermes/Qwen-style
  chat template that renders ``tools`` and assistant ``tool_calls``, matching
  Dynamo's ``hermes`` tool-call parser (``<tool_call>{"name": ..., "arguments":
  ...}</tool_call>``). Written for jinja2 and minijinja (Dynamo's frontend).
* ``generation_config.json``, ``special_tokens_map.json``.

Deterministic: a fixed seed and integer-derived weight values (exactly
representable in float32, no libm), so every call returns byte-identical
output for a given ``tokenizers`` release. With random weights the text is
meaningless; what it exercises is the serving path (tokenizer, template,
prefill/decode, KV transfer, guided tool calls).
"""

from __future__ import annotations

import json
import random
import struct
from array import array
from pathlib import Path
from typing import Any, Final

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "HEAD_DIM",
    "HIDDEN_SIZE",
    "NUM_ATTENTION_HEADS",
    "NUM_HIDDEN_LAYERS",
    "NUM_KEY_VALUE_HEADS",
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "VOCAB_SIZE",
    "tiny_model_files",
    "write_tiny_model",
]

SEED: Final[int] = 20261201
HIDDEN_SIZE: Final[int] = 128
INTERMEDIATE_SIZE: Final[int] = 256
NUM_HIDDEN_LAYERS: Final[int] = 2
NUM_ATTENTION_HEADS: Final[int] = 4
NUM_KEY_VALUE_HEADS: Final[int] = 2
HEAD_DIM: Final[int] = HIDDEN_SIZE // NUM_ATTENTION_HEADS  # 32
#: Size of the trained BPE vocabulary (byte alphabet + merges), before added tokens.
BPE_VOCAB_SIZE: Final[int] = 1024
#: Embedding rows in the weights (>= tokenizer size; a multiple of 64).
VOCAB_SIZE: Final[int] = 1088

EOS_TOKEN: Final[str] = "<|endoftext|>"
IM_START: Final[str] = "<|im_start|>"
IM_END: Final[str] = "<|im_end|>"
TOOL_CALL_START: Final[str] = "<tool_call>"
TOOL_CALL_END: Final[str] = "</tool_call>"
#: Added after the trained vocabulary, in this order: (content, special).
ADDED_TOKENS: Final[tuple[tuple[str, bool], ...]] = (
    (EOS_TOKEN, True),
    (IM_START, True),
    (IM_END, True),
    (TOOL_CALL_START, False),
    (TOOL_CALL_END, False),
)

#: Hermes/Qwen2.5-style template. Only filters and tests that jinja2 and
#: minijinja both have; no Python string methods.
CHAT_TEMPLATE: Final[str] = (
    "{%- macro render_content(content) -%}"
    "{%- if content is not defined or content is none -%}"
    "{%- elif content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system_message = messages[0].content -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system_message = none -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- if tools is defined and tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if system_message is not none -%}{{- render_content(system_message) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}"
    "{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '"
    " + 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    ' + \'{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- elif system_message is not none -%}"
    "{{- '<|im_start|>system\\n' + render_content(system_message) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message.role == 'user' or message.role == 'system' -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + render_content(message.content) + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if message.content is defined -%}{{- render_content(message.content) -}}{%- endif -%}"
    "{%- if message.tool_calls is defined and message.tool_calls -%}"
    "{%- for tool_call in message.tool_calls -%}"
    "{%- if tool_call.function is defined -%}{%- set call = tool_call.function -%}"
    "{%- else -%}{%- set call = tool_call -%}{%- endif -%}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call.name + '\", \"arguments\": ' -}}"
    "{%- if call.arguments is string -%}{{- call.arguments -}}"
    "{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt is defined and add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_WORDS: Final[tuple[str, ...]] = (
    "the", "a", "of", "to", "and", "in", "is", "it", "you", "that", "for", "on", "with", "as", "are",
    "weather", "city", "paris", "london", "tokyo", "berlin", "unit", "celsius", "fahrenheit", "today",
    "tomorrow", "search", "query", "result", "name", "arguments", "function", "tool", "call", "value",
    "order", "status", "user", "assistant", "system", "hello", "please", "thanks", "number", "list",
    "get", "set", "find", "book", "flight", "hotel", "date", "time", "price", "count", "limit", "true",
    "false", "null", "yes", "no", "ok", "error", "message", "answer", "question", "model", "token",
)
_SYMBOLS: Final[str] = "0123456789.,:;!?-_/()[]{}<>&'\"=+*#@%$"


def _corpus(rng: random.Random, lines: int = 3000) -> list[str]:
    """Generated training text: prose, JSON tool calls and chat markup."""
    out: list[str] = []
    for i in range(lines):
        n = rng.randint(3, 14)
        words = [rng.choice(_WORDS) for _ in range(n)]
        kind = i % 4
        if kind == 0:
            out.append(" ".join(words).capitalize() + rng.choice(".?!"))
        elif kind == 1:
            args = {words[0]: words[1], words[2]: rng.randint(0, 999), "unit": rng.choice(("celsius", "fahrenheit"))}
            call = json.dumps({"name": "get_" + words[-1], "arguments": args})
            out.append(f"{TOOL_CALL_START}\n{call}\n{TOOL_CALL_END}")
        elif kind == 2:
            out.append(f"{IM_START}user\n{' '.join(words)}{IM_END}\n{IM_START}assistant\n")
        else:
            out.append("".join(rng.choice(_SYMBOLS) for _ in range(n)) + " " + " ".join(words).upper())
    return out


def _tokenizer_json() -> bytes:
    """Train the byte-level BPE tokenizer and serialise it (canonical JSON)."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(BPE(fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_corpus(random.Random(SEED)), trainer=trainer)
    for content, special in ADDED_TOKENS:
        token = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    total = tok.get_vocab_size(with_added_tokens=True)
    if total > VOCAB_SIZE:
        raise AssertionError(f"tokenizer has {total} tokens, more than the {VOCAB_SIZE} embedding rows")
    return _dumps(json.loads(tok.to_str()))


def _token_ids(tokenizer_json: bytes) -> dict[str, int]:
    """Ids of the added tokens, read back from the serialised tokenizer."""
    data = json.loads(tokenizer_json)
    return {t["content"]: int(t["id"]) for t in data["added_tokens"]}


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n").encode("utf-8")


def _tensor_shapes() -> dict[str, tuple[int, ...]]:
    """Qwen2ForCausalLM parameter names and shapes (tied embeddings: no lm_head)."""
    h, inter, hd = HIDDEN_SIZE, INTERMEDIATE_SIZE, HEAD_DIM
    q, kv = NUM_ATTENTION_HEADS * hd, NUM_KEY_VALUE_HEADS * hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB_SIZE, h), "model.norm.weight": (h,)}
    for i in range(NUM_HIDDEN_LAYERS):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.q_proj.bias": (q,),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _random_f32(rng: random.Random, count: int, scale_log2: int) -> bytes:
    """``count`` little-endian float32 values uniform in [-2**scale_log2, 2**scale_log2).

    Each value is a 16-bit random integer times a power of two, so it is exact
    in float32 and identical on every platform.
    """
    raw = array("H")
    raw.frombytes(rng.randbytes(2 * count))
    step = 2.0 ** (scale_log2 - 15)
    values = array("f", [(r - 32768) * step for r in raw])
    if struct.pack("=I", 1) != struct.pack("<I", 1):
        values.byteswap()
    return values.tobytes()


def _ones_f32(count: int) -> bytes:
    return struct.pack(f"<{count}f", *([1.0] * count))


def _safetensors() -> bytes:
    """Serialise the random weights in the safetensors format (F32, sorted names)."""
    rng = random.Random(SEED)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    chunks: list[bytes] = []
    offset = 0
    for name, shape in sorted(_tensor_shapes().items()):
        count = _numel(shape)
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            data = _ones_f32(count)
        elif name.endswith(".bias"):
            data = _random_f32(rng, count, -7)
        else:
            data = _random_f32(rng, count, -5)  # ~U(-1/32, 1/32): std 0.018, like init_range 0.02
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(chunks)


def _config(served_name: str, max_context: int, ids: dict[str, int]) -> dict[str, Any]:
    return {
        "_name_or_path": served_name,
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "attention_dropout": 0.0,
        "bos_token_id": ids[EOS_TOKEN],
        "eos_token_id": ids[IM_END],
        "hidden_act": "silu",
        "hidden_size": HIDDEN_SIZE,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE_SIZE,
        "max_position_embeddings": max_context,
        "max_window_layers": NUM_HIDDEN_LAYERS,
        "num_attention_heads": NUM_ATTENTION_HEADS,
        "num_hidden_layers": NUM_HIDDEN_LAYERS,
        "num_key_value_heads": NUM_KEY_VALUE_HEADS,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": VOCAB_SIZE,
    }


def _generation_config(ids: dict[str, int]) -> dict[str, Any]:
    return {
        "bos_token_id": ids[EOS_TOKEN],
        "eos_token_id": [ids[IM_END], ids[EOS_TOKEN]],
        "pad_token_id": ids[EOS_TOKEN],
        "do_sample": True,
        "temperature": 0.7,
        "top_p": 0.8,
    }


def _tokenizer_config(served_name: str, max_context: int, ids: dict[str, int]) -> dict[str, Any]:
    decoder = {
        str(ids[content]): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for content, special in ADDED_TOKENS
    }
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": max_context,
        "name_or_path": served_name,
        "pad_token": EOS_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def tiny_model_files(served_name: str = "tiny", max_context: int = 2048) -> dict[str, bytes]:
    """The tiny model directory as {relative file name: bytes}; deterministic, no I/O.

    Args:
        served_name: recorded as ``_name_or_path`` / ``name_or_path``.
        max_context: ``max_position_embeddings`` and ``model_max_length``.

    Raises:
        ValueError: if ``max_context`` is not positive or ``served_name`` is empty.
    """
    if max_context <= 0:
        raise ValueError(f"max_context must be positive, got {max_context}")
    if not served_name:
        raise ValueError("served_name must be non-empty")
    tokenizer = _tokenizer_json()
    ids = _token_ids(tokenizer)
    return {
        "chat_template.jinja": CHAT_TEMPLATE.encode("utf-8"),
        "config.json": _dumps(_config(served_name, max_context, ids)),
        "generation_config.json": _dumps(_generation_config(ids)),
        "model.safetensors": _safetensors(),
        "special_tokens_map.json": _dumps({"eos_token": IM_END, "pad_token": EOS_TOKEN}),
        "tokenizer.json": tokenizer,
        "tokenizer_config.json": _dumps(_tokenizer_config(served_name, max_context, ids)),
    }


def write_tiny_model(dest: Path, served_name: str = "tiny", max_context: int = 2048) -> None:
    """Write :func:`tiny_model_files` into ``dest`` (created if missing; same-named files overwritten)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, data in tiny_model_files(served_name, max_context).items():
        (dest / name).write_bytes(data)


if __name__ == "__main__":
    import sys

    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m primectl.tiny_model DEST [SERVED_NAME]")
    write_tiny_model(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) == 3 else "tiny")
