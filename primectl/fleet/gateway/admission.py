"""What a gateway replica admits requests within: fleet-wide concurrency pools and token budgets held in etcd
blocks, who is calling, and each deployment's pools and breaker as this replica sees them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Pool:
    """A fleet-wide limit of concurrent requests (a deployment's capacity, a team's or a key's concurrency), cut into
    blocks of `block` slots: keys `<path><i>` in etcd, each held by one replica on its lease."""

    path: str
    capacity: int
    block: int
    spare: bool = False  # keep one idle block (a deployment's: the next request claims nothing)
    usable: int | None = None  # claim only blocks 0..usable-1 (batch: the last ones stay for interactive traffic)
    prefer_from: int = 0  # claim blocks from here on first (interactive: the reserve, so batch finds the rest)
    held: dict[int, int] = field(default_factory=dict)  # block -> its slots
    inflight: int = 0

    @property
    def blocks(self) -> int:
        every = -(-self.capacity // self.block)
        return every if self.usable is None else min(every, self.usable)

    @property
    def granted(self) -> int:
        return sum(self.held.values())

    def size(self, i: int) -> int:
        """Block i's slots: the last block holds what is left, so the blocks add up to the capacity exactly."""
        return min(self.block, self.capacity - i * self.block)


@dataclass
class Budget:
    """A fleet-wide tokens-per-minute budget: each minute a Pool of `per_minute` tokens in blocks of a sixteenth of
    it (keys `<path><minute>/<i>` on the claiming replicas' leases), and what this replica spent of it."""

    path: str
    per_minute: int
    minute: int = -1
    spent: int = 0
    reserved: int = 0  # what the requests admitted this minute and still running are expected to spend
    pool: Pool | None = None
    past: list[Pool] = field(default_factory=list)  # earlier minutes' blocks this replica still holds

    def for_minute(self, minute: int) -> Pool:
        """This minute's pool (a fresh one, nothing spent or reserved, when the minute changed)."""
        if self.pool is None or minute != self.minute:
            if self.pool is not None:
                self.past.append(self.pool)
            self.minute, self.spent, self.reserved = minute, 0, 0
            self.pool = Pool(f"{self.path}{minute}/", self.per_minute, -(-self.per_minute // 16))
        return self.pool

    def release(self, minute: int, tokens: int) -> None:
        """A request admitted in `minute` with `tokens` reserved has ended (its usage is spent on its own)."""
        if minute == self.minute:
            self.reserved = max(0, self.reserved - tokens)


def expected_tokens(body: dict[str, Any]) -> int:
    """What a request is expected to spend before it is answered, as OpenAI's own rate limits count it: its prompt
    at four characters a token (the messages as JSON, or the prompt) plus the most it may generate."""
    prompt = body.get("messages") if "messages" in body else body.get("prompt", "")
    text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    most = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    n = body.get("n") or 1
    most = most if isinstance(most, int | float) else 0  # a malformed field is the deployment's to refuse
    n = n if isinstance(n, int) else 1
    return len(text) // 4 + int(most) * n


@dataclass
class Caller:
    """Who sent a request: the key's team and id (its hash), its class and its own limits."""

    team: str
    kid: str
    batch: bool
    limits: dict[str, Any]


@dataclass
class Deployment:
    """One deployment as this replica sees it."""

    name: str
    url: str
    weight: int
    role: str
    pool: Pool
    batch: Pool  # the same blocks in etcd, less the reserve: batch requests claim only these
    failures: int = 0
    open_since: float | None = None  # the shared breaker, as last heard
    probing: bool = False

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    @property
    def inflight(self) -> int:
        return self.pool.inflight + self.batch.inflight

    @property
    def granted(self) -> int:
        return self.pool.granted + self.batch.granted

    def pool_for(self, caller: Caller) -> Pool:
        return self.batch if caller.batch else self.pool
