"""The agentic workload: AgentX-style sessions plus cold long prompts, as an AIPerf input file.

Pure and seeded: the same spec, seed, block size and session count always give
byte-identical output.

A session is a coding agent: a long first prompt (a system prompt + tools block
shared by every session, then the session's own context), then turns that each
add ~`turn_tokens` and resend the whole history, with an output length and a
think time (delay before the turn) per turn. Cold prompts are single-turn
requests with a long prompt nothing else shares.

The file is AIPerf's `mooncake_trace` JSONL (the only custom format of AIPerf
0.13.0 that takes exact token counts and per-block `hash_ids`; `multi_turn`
takes literal text only). Rows with the same `session_id` form one multi-turn
conversation. AIPerf replays them in its default context mode
(`deltas_without_responses`): each row carries only what the turn ADDS
(`input_length` tokens, `hash_ids` for those blocks), and AIPerf itself
resends the accumulated history plus the live assistant replies on every turn.
So the prompt of turn k is the whole history, and the block ids of that
prompt (`Request.prefix_hash_ids`) start with the ids of turn k-1's prompt.
Equal hash ids decode to equal text (AIPerf maps each id to one block of
`--isl-block-size` tokens), which is how the shared system prompt becomes a
real cross-session prefix.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class WorkloadSpec:
    """Sizes of one workload preset (tokens, milliseconds)."""

    name: str
    initial_tokens: int = field(metadata={"help": "first prompt of a session, shared prefix included"})
    shared_prefix_tokens: int = field(metadata={"help": "system prompt + tools shared by all sessions (whole blocks)"})
    turn_tokens: int = field(metadata={"help": "tokens each later turn adds"})
    turns: int = field(metadata={"help": "turns per session"})
    output_tokens: int = field(metadata={"help": "mean output tokens per turn"})
    think_time_ms: float = field(metadata={"help": "mean delay before a later turn (exponential)"})
    cold_tokens: int = field(metadata={"help": "prompt length of a cold request"})
    cold_share: float = field(metadata={"help": "fraction of all requests that are cold prompts"})
    jitter: float = field(default=0.1, metadata={"help": "relative +- spread of turn and output lengths"})
    sessions_per_slot: int = field(default=8, metadata={"help": "sessions written per unit of concurrency"})
    ignore_eos: bool = field(default=False, metadata={"help": "ask for exactly the output tokens (the engine "
                                                               "ignores end-of-sequence)"})

    def __post_init__(self) -> None:
        ints = {k: getattr(self, k) for k in ("initial_tokens", "turn_tokens", "turns", "output_tokens", "cold_tokens",
                                              "sessions_per_slot")}
        bad = [k for k, v in ints.items() if v < 1]
        if bad:
            raise ValueError(f"workload {self.name}: {', '.join(bad)} must be at least 1")
        if not 0 <= self.shared_prefix_tokens <= self.initial_tokens:
            raise ValueError(f"workload {self.name}: shared_prefix_tokens must be within 0..initial_tokens")
        if not 0 <= self.cold_share < 1:
            raise ValueError(f"workload {self.name}: cold_share must be in [0, 1)")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"workload {self.name}: jitter must be in [0, 1)")
        if self.think_time_ms < 0:
            raise ValueError(f"workload {self.name}: think_time_ms must be >= 0")


#: Production sizes (mission brief: a turn adds ~6K tokens to a ~140K-token prompt) and the
#: CPU-demo scale-down (the demo model's context is 32K and the mocker is fast).
PRESETS: dict[str, WorkloadSpec] = {
    "agentic": WorkloadSpec(
        name="agentic", initial_tokens=116_000, shared_prefix_tokens=8_192, turn_tokens=6_000, turns=8,
        output_tokens=400, think_time_ms=3_000, cold_tokens=140_000, cold_share=0.1, sessions_per_slot=3),
    "agentic-demo": WorkloadSpec(
        name="agentic-demo", initial_tokens=2_048, shared_prefix_tokens=512, turn_tokens=300, turns=6,
        output_tokens=32, think_time_ms=100, cold_tokens=4_096, cold_share=0.1, sessions_per_slot=12),
    # A real engine on CPU with a 2K-context model (demo-vllm): every prompt stays well inside the context. 128
    # output tokens: a busy client that reads a few quick tokens in one chunk can time none of them apart. The
    # model has random weights, so it stops at a random end-of-sequence: measured, 11 of 40 answers stopped
    # early, and one that stops at its first token has no content, which AIPerf counts as a failed request.
    "agentic-tiny": WorkloadSpec(
        name="agentic-tiny", initial_tokens=256, shared_prefix_tokens=128, turn_tokens=64, turns=4,
        output_tokens=128, think_time_ms=200, cold_tokens=512, cold_share=0.1, sessions_per_slot=4,
        ignore_eos=True),
}


@dataclass(frozen=True)
class Request:
    """One request of the workload (one row of the AIPerf input file)."""

    session_id: str
    turn: int
    new_tokens: int
    output_tokens: int
    delay_ms: float | None
    new_hash_ids: tuple[int, ...]
    prefix_hash_ids: tuple[int, ...]
    context_tokens: int
    cold: bool

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the whole prompt (history + this turn), chat-template tokens not counted."""
        return self.context_tokens + self.new_tokens

    def record(self) -> dict[str, Any]:
        """The mooncake_trace row: only this turn's new tokens and blocks (AIPerf resends the history)."""
        row: dict[str, Any] = {"session_id": self.session_id, "input_length": self.new_tokens,
                               "output_length": self.output_tokens, "hash_ids": list(self.new_hash_ids)}
        if self.delay_ms is not None:
            row["delay"] = self.delay_ms
        return row


@dataclass(frozen=True)
class Workload:
    """A generated workload, in the order it is written."""

    spec: WorkloadSpec
    seed: int
    block_size: int
    requests: tuple[Request, ...]

    def sessions(self) -> dict[str, list[Request]]:
        """session id -> its requests in turn order (cold prompts are one-request sessions)."""
        out: dict[str, list[Request]] = {}
        for r in self.requests:
            out.setdefault(r.session_id, []).append(r)
        return out

    def to_jsonl(self) -> str:
        """The AIPerf `mooncake_trace` input file."""
        return "".join(json.dumps(r.record(), separators=(",", ":")) + "\n" for r in self.requests)

    def write(self, path: Path) -> Path:
        path.write_text(self.to_jsonl())
        return path

    def stats(self) -> dict[str, Any]:
        """Sizes and the theoretical prefix-cache hit rate.

        Theoretical = unbounded cache, whole blocks: a later turn finds its whole history cached
        (previous prompt and reply); a first turn or cold prompt finds the leading blocks some
        earlier request already sent (the shared system prompt).
        """
        seen: set[int] = set()
        cached = total = 0
        for r in self.requests:
            if r.turn:
                cached += r.context_tokens
            else:
                hit = 0
                for b in r.prefix_hash_ids:
                    if b not in seen:
                        break
                    hit += 1
                cached += min(hit * self.block_size, r.new_tokens)
            total += r.prompt_tokens
            seen.update(r.prefix_hash_ids)
        prompts = [r.prompt_tokens for r in self.requests]
        return {
            "preset": self.spec.name, "seed": self.seed, "block_size": self.block_size,
            "sessions": sum(1 for s in self.sessions().values() if not s[0].cold),
            "cold_prompts": sum(r.cold for r in self.requests),
            "requests": len(self.requests),
            "prompt_tokens_mean": round(sum(prompts) / len(prompts), 1) if prompts else 0,
            "prompt_tokens_max": max(prompts, default=0),
            "theoretical_prefix_hit_rate": round(cached / total, 4) if total else 0.0,
            "spec": asdict(self.spec),
        }


def _blocks(n_tokens: int, block_size: int) -> int:
    return math.ceil(n_tokens / block_size)


def generate(spec: WorkloadSpec, *, seed: int, block_size: int, sessions: int) -> Workload:
    """Generate `sessions` agent sessions plus cold prompts at `spec.cold_share` of all requests."""
    if block_size < 1 or sessions < 1:
        raise ValueError("block_size and sessions must be at least 1")
    rng = random.Random(seed)
    shared_blocks = spec.shared_prefix_tokens // block_size  # only whole blocks can be shared
    shared_ids = tuple(range(shared_blocks))
    next_id = shared_blocks

    def fresh(n_tokens: int) -> tuple[int, ...]:
        nonlocal next_id
        ids = tuple(range(next_id, next_id + _blocks(n_tokens, block_size)))
        next_id += len(ids)
        return ids

    def jittered(mean: int) -> int:
        return max(1, round(mean * rng.uniform(1 - spec.jitter, 1 + spec.jitter)))

    per_session: list[list[Request]] = []
    for s in range(sessions):
        sid = f"s{seed}-{s:05d}"
        reqs: list[Request] = []
        prefix: tuple[int, ...] = ()
        context = 0
        for t in range(spec.turns):
            if t == 0:
                new = spec.initial_tokens
                ids = shared_ids + fresh(new - shared_blocks * block_size) if new > shared_blocks * block_size \
                    else shared_ids[: _blocks(new, block_size)]
                delay: float | None = None
            else:
                new = jittered(spec.turn_tokens)
                ids = fresh(new)
                delay = round(rng.expovariate(1 / spec.think_time_ms), 1) if spec.think_time_ms else 0.0
            out = jittered(spec.output_tokens)
            prefix = prefix + ids
            reqs.append(Request(sid, t, new, out, delay, ids, prefix, context, cold=False))
            context += new + out
        per_session.append(reqs)

    n_session_reqs = sessions * spec.turns
    n_cold = round(spec.cold_share * n_session_reqs / (1 - spec.cold_share))
    colds: list[Request] = []
    for c in range(n_cold):
        ids = fresh(spec.cold_tokens)
        colds.append(Request(f"cold{seed}-{c:05d}", 0, spec.cold_tokens, jittered(spec.output_tokens), None,
                             ids, ids, 0, cold=True))

    # Spread the cold prompts evenly between sessions (AIPerf replays traces in file order).
    ordered: list[Request] = []
    placed = 0
    for i, reqs in enumerate(per_session):
        ordered += reqs
        due = round(n_cold * (i + 1) / sessions)
        ordered += colds[placed:due]
        placed = due
    return Workload(spec, seed, block_size, tuple(ordered))


def preset(name: str, **overrides: Any) -> WorkloadSpec:
    """A preset by name, with field overrides (ValueError for an unknown name)."""
    if name not in PRESETS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides) if overrides else PRESETS[name]


@dataclass(frozen=True)
class TraceInfo:
    """What a user-supplied trace file holds."""

    rows: int
    sessions: int
    has_hash_ids: bool


def inspect_trace(path: Path) -> TraceInfo:
    """Check a user trace is mooncake_trace JSONL (one JSON object per line with a prompt); ValueError if not."""
    rows = 0
    sessions: set[str] = set()
    hashed = False
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc.strerror}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: each line must be a JSON object")
        if not any(k in row for k in ("input_length", "text_input", "messages", "payload")):
            raise ValueError(f"{path}:{n}: needs one of input_length, text_input, messages, payload "
                             "(AIPerf mooncake_trace)")
        rows += 1
        sessions.add(str(row.get("session_id", f"#{n}")))
        hashed = hashed or "hash_ids" in row
    if not rows:
        raise ValueError(f"{path}: no rows")
    return TraceInfo(rows, len(sessions), hashed)
