"""The host agent's log patterns skip the regex engine for lines they cannot match: what they find must be what
the regular expression alone finds, on the lines engines write."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from primectl.host import agent, logs

LINES = [
    "fake runtime: -m dynamo.mocker --model-path /models/demo",
    "2026-12-03T21:40:01.123456Z  INFO dynamo_runtime::distributed: loading weights",
    "2026-12-03T21:40:01Z GET /health 503",
    "\x1b[32mINFO\x1b[0m 12-03 21:40:02 [model_runner.py:1160] Loading model weights took 1.2 GB",
    "\x1b]0;title\x07Loading safetensors checkpoint shards:  50% Completed | 1/2",
    "   2024-01-01T00:00:00 leading blanks are not a stamp",
    "\u0661\u0662\u0663\u0664-01-01T00:00:00 Arabic-Indic digits are digits to \\d",
    "tower_http::trace::on_response: finished processing request latency=0 ms status=503",
    'INFO:     127.0.0.1:50000 - "GET /live HTTP/1.1" 200 OK',
    "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "ValueError:no space after the colon",
    "torch.OutOfMemoryError: CUDA out of memory",
    "Downloading model.safetensors (4.2 GB)",
    "  Downloading model.safetensors (4.2 GB)",
    "",
]

PATTERNS = ["PROBE_ECHO", "LOG_STAMP", "ANSI_ESCAPE", "ERROR_LINE", "DOWNLOADED"]


@pytest.mark.parametrize("name", PATTERNS)
def test_a_guarded_pattern_finds_what_the_regex_finds(name: str) -> None:
    lazy = getattr(logs, name, None) or getattr(agent, name)
    plain = re.compile(lazy.source)
    for line in LINES:
        ours, theirs = lazy.search(line), plain.search(line)
        assert (ours and ours.group(0)) == (theirs and theirs.group(0)), (name, line)
        assert lazy.sub("", line) == plain.sub("", line), (name, line)


def test_the_last_log_line_leaves_out_stamps_escapes_and_probe_echoes(tmp_path: Path) -> None:
    log = tmp_path / "decode.log"
    log.write_text("--- primectl: starting decode-1\nfake runtime: -m dynamo.mocker\nserving on 127.0.0.2:9100\n")
    assert logs.last_log_line(str(log)) == "serving on 127.0.0.2:9100"
    log.write_text("2026-12-03T21:40:01Z \x1b[1mloading\x1b[0m weights\n2026-12-03T21:40:02Z GET /health 503\n")
    assert logs.last_log_line(str(log)) == "loading weights"
