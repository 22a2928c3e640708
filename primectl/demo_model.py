"""A tiny, self-consistent model directory for the CPU demo (Dynamo mocker).

The Dynamo 1.6.1 mocker emits a uniformly random token id in [1000, 2000) for
every generated token, and the frontend drops ids its tokenizer does not know.
:func:`write_demo_model` therefore writes a tokenizer whose ids 1000-1999 are
all ordinary lowercase words (``"Ġ" + two consonant-vowel syllables``, e.g.
``" bado"``), each of which decodes to visible text and re-encodes to exactly
that one id through byte-level BPE. Special tokens (bos/eos/pad, chat-role
markers) live at ids >= 2000.

Nothing is downloaded: the vocabulary and merges are constructed directly, so
the output is byte-identical on every call (for a given ``tokenizers``
release, which decides the serialisation of ``tokenizer.json``).

Vocabulary layout (``VOCAB_SIZE`` = 2048):

* 0-255      byte-level alphabet (GPT-2 ``bytes_to_unicode``), in byte order
* 256-355    the 100 syllables ``consonant + vowel`` (``"ba"`` ... ``"zu"``)
* 356-455    the same syllables with a leading space (``"Ġba"`` ...)
* 456-1999   1544 two-syllable words with a leading space (``"Ġbado"`` ...)
* 2000-2047  special / added tokens (:data:`SPECIAL_TOKENS`), padded with
  reserved specials
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Final

__all__ = [
    "BOS_TOKEN",
    "CHAT_TEMPLATE",
    "END_OF_TURN_TOKEN",
    "EOS_TOKEN",
    "MOCKER_TOKEN_RANGE",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "VOCAB_SIZE",
    "write_demo_model",
]

#: Half-open range of token ids the Dynamo 1.6.1 mocker generates.
MOCKER_TOKEN_RANGE: Final[range] = range(1000, 2000)

_CONSONANTS: Final[str] = "bdfghjklmnprstvwyzcx"  # 20 consonants
_VOWELS: Final[str] = "aeiou"  # 5 vowels
_SYLLABLES: Final[tuple[str, ...]] = tuple(c + v for c in _CONSONANTS for v in _VOWELS)
_N_WORDS: Final[int] = 2000 - 456  # two-syllable words at ids 456-1999
_WORD_STRIDE: Final[int] = 7919  # prime, coprime to 100*100: a permutation

_FIRST_SPECIAL_ID: Final[int] = 2000
VOCAB_SIZE: Final[int] = 2048

BOS_TOKEN: Final[str] = "<|begin_of_text|>"
EOS_TOKEN: Final[str] = "<|end_of_text|>"
PAD_TOKEN: Final[str] = "<|pad|>"
END_OF_TURN_TOKEN: Final[str] = "<|end|>"

#: (content, special) for ids 2000, 2001, ...; padded to VOCAB_SIZE with
#: reserved special tokens. Non-special added tokens (tool-call and reasoning
#: markers) stay visible in decoded text so tool/reasoning parsers can see them.
SPECIAL_TOKENS: Final[tuple[tuple[str, bool], ...]] = (
    (BOS_TOKEN, True),
    (EOS_TOKEN, True),
    (PAD_TOKEN, True),
    ("<|system|>", True),
    ("<|user|>", True),
    ("<|assistant|>", True),
    ("<|tool|>", True),
    (END_OF_TURN_TOKEN, True),
    ("<tools>", False),
    ("</tools>", False),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    *tuple((f"<|reserved_special_token_{i}|>", True) for i in range(VOCAB_SIZE - _FIRST_SPECIAL_ID - 16)),
)

#: Jinja chat template (Hermes-style tool calling). Renders system, user,
#: assistant (with optional ``tool_calls``) and ``tool`` messages; ``tools``
#: are listed as JSON in the system turn. Written for both jinja2 and
#: minijinja (the Rust engine Dynamo's frontend uses): no Python methods.
CHAT_TEMPLATE: Final[str] = (
    "{%- macro render_content(content) -%}"
    "{%- if content is not defined or content is none -%}"
    "{%- elif content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{{- bos_token -}}"
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system_message = messages[0].content -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system_message = none -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- if tools is defined and tools -%}"
    "{{- '<|system|>\\n' -}}"
    "{%- if system_message is not none -%}{{- render_content(system_message) + '\\n\\n' -}}{%- endif -%}"
    "{{- 'You may call one or more functions. Function signatures:\\n<tools>\\n' -}}"
    "{%- for tool in tools -%}{{- tool | tojson -}}{{- '\\n' -}}{%- endfor -%}"
    '{{- \'</tools>\\nFor each call, reply with <tool_call>{"name": <name>, '
    '"arguments": <json object>}</tool_call>.<|end|>\\n\' -}}'
    "{%- elif system_message is not none -%}"
    "{{- '<|system|>\\n' + render_content(system_message) + '<|end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message.role == 'user' -%}"
    "{{- '<|user|>\\n' + render_content(message.content) + '<|end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|assistant|>\\n' -}}"
    "{%- if message.content is defined -%}{{- render_content(message.content) -}}{%- endif -%}"
    "{%- if message.tool_calls is defined and message.tool_calls -%}"
    "{%- for tool_call in message.tool_calls -%}"
    "{%- if tool_call.function is defined -%}{%- set call = tool_call.function -%}"
    "{%- else -%}{%- set call = tool_call -%}{%- endif -%}"
    '{{- \'<tool_call>{"name": "\' + call.name + \'", "arguments": \' -}}'
    "{%- if call.arguments is string -%}{{- call.arguments -}}"
    "{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}"
    "{{- '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{{- '<|tool|>\\n<tool_response>' + render_content(message.content) + '</tool_response><|end|>\\n' -}}"
    "{%- elif message.role == 'system' -%}"
    "{{- '<|system|>\\n' + render_content(message.content) + '<|end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt is defined and add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)


def _bytes_to_unicode() -> list[str]:
    """GPT-2's reversible byte -> printable-unicode map, indexed by byte value."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def _build_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Construct the BPE vocabulary (ids 0-1999) and its merge list."""
    alphabet = _bytes_to_unicode()
    space = alphabet[ord(" ")]  # "Ġ"
    vocab: dict[str, int] = {ch: i for i, ch in enumerate(alphabet)}
    merges: list[tuple[str, str]] = []
    # Rank order matters: syllables first, then space+syllable, then words,
    # so "Ġ b a d o" -> "Ġ ba do" -> "Ġba do" -> "Ġbado" deterministically.
    for syl in _SYLLABLES:
        vocab[syl] = len(vocab)
        merges.append((syl[0], syl[1]))
    for syl in _SYLLABLES:
        vocab[space + syl] = len(vocab)
        merges.append((space, syl))
    n_syl = len(_SYLLABLES)
    for k in range(_N_WORDS):
        code = (k * _WORD_STRIDE) % (n_syl * n_syl)
        first, second = _SYLLABLES[code // n_syl], _SYLLABLES[code % n_syl]
        vocab[space + first + second] = len(vocab)
        merges.append((space + first, second))
    assert len(vocab) == _FIRST_SPECIAL_ID, len(vocab)
    return vocab, merges


def _tokenizer_json() -> str:
    """Serialise the tokenizer with the ``tokenizers`` library (canonical JSON)."""
    from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import BPE

    vocab, merges = _build_vocab_and_merges()
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # add_tokens/add_special_tokens append after the model vocab: ids 2000+.
    for content, special in SPECIAL_TOKENS:
        token = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False)
        if special:
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
    if tok.get_vocab_size(with_added_tokens=True) != VOCAB_SIZE:
        raise AssertionError(f"vocab size {tok.get_vocab_size(with_added_tokens=True)} != {VOCAB_SIZE}")
    for offset, (content, _) in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(content) != _FIRST_SPECIAL_ID + offset:
            raise AssertionError(f"{content!r} not at id {_FIRST_SPECIAL_ID + offset}")
    return _dumps(json.loads(tok.to_str()))


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def _config(served_name: str, max_context: int) -> dict[str, Any]:
    """A plausible tiny llama-style config; only the metadata is ever used."""
    return {
        "_name_or_path": served_name,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": _FIRST_SPECIAL_ID,
        "eos_token_id": [_FIRST_SPECIAL_ID + 1, _FIRST_SPECIAL_ID + 7],
        "pad_token_id": _FIRST_SPECIAL_ID + 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": max_context,
        "mlp_bias": False,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": VOCAB_SIZE,
    }


def _generation_config() -> dict[str, Any]:
    return {
        "bos_token_id": _FIRST_SPECIAL_ID,
        "eos_token_id": [_FIRST_SPECIAL_ID + 1, _FIRST_SPECIAL_ID + 7],
        "pad_token_id": _FIRST_SPECIAL_ID + 2,
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.9,
    }


def _tokenizer_config(served_name: str, max_context: int) -> dict[str, Any]:
    added = {
        str(_FIRST_SPECIAL_ID + i): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, (content, special) in enumerate(SPECIAL_TOKENS)
    }
    return {
        "added_tokens_decoder": added,
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": BOS_TOKEN,
        "eos_token": END_OF_TURN_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": max_context,
        "name_or_path": served_name,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def _special_tokens_map() -> dict[str, Any]:
    return {"bos_token": BOS_TOKEN, "eos_token": END_OF_TURN_TOKEN, "pad_token": PAD_TOKEN}


def demo_model_files(served_name: str = "demo", max_context: int = 32768) -> dict[str, str]:
    """The demo model directory as {file name: text}; deterministic, no I/O.

    Raises:
        ValueError: if ``max_context`` is not positive or ``served_name`` empty.
    """
    if max_context <= 0:
        raise ValueError(f"max_context must be positive, got {max_context}")
    if not served_name:
        raise ValueError("served_name must be non-empty")
    return {
        "config.json": _dumps(_config(served_name, max_context)),
        "generation_config.json": _dumps(_generation_config()),
        "tokenizer.json": _tokenizer_json(),
        "tokenizer_config.json": _dumps(_tokenizer_config(served_name, max_context)),
        "special_tokens_map.json": _dumps(_special_tokens_map()),
    }


def write_demo_model(dest: pathlib.Path, served_name: str = "demo", max_context: int = 32768) -> None:
    """Write a tiny demo model directory (tokenizer + configs, no weights) to ``dest``.

    Files: ``config.json``, ``generation_config.json``, ``tokenizer.json``,
    ``tokenizer_config.json``, ``special_tokens_map.json``. Output is
    deterministic: two calls with the same arguments produce byte-identical
    files. Existing files of those names are overwritten; other files are left
    alone. Requires the ``tokenizers`` package; no network access.

    Args:
        dest: directory to create/populate.
        served_name: model name recorded in the configs (``_name_or_path``).
        max_context: ``max_position_embeddings`` / ``model_max_length``.

    Raises:
        ValueError: if ``max_context`` is not positive or ``served_name`` empty.
    """
    dest = pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, text in demo_model_files(served_name, max_context).items():
        (dest / name).write_text(text, encoding="utf-8")
