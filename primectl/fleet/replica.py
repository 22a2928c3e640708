#!/usr/bin/env python3
"""A fleet gateway replica: one public OpenAI endpoint over several deployments.

Shipped to gateway hosts in the bundle and run with the host runtime's Python (aiohttp, the standard library,
and etcd's own JSON gateway: no primectl, no third-party etcd client). Everything replicas share lives in the
fleet's etcd, under the config's `prefix`:

- `keys/<sha256 of the key>`: the team a key belongs to. A key itself is never stored, logged or forwarded.
- `breaker/<deployment>`: present while the deployment's circuit breaker is open. Any replica that sees
  `breaker.failures` consecutive failures (a refused connection, a 5xx before the first byte; never a 429/529,
  which is overload, not failure) writes it; every replica learns it through a watch. After
  `breaker.cooldown_s` exactly one replica (the one that creates `probe/<deployment>` on its lease) probes the
  deployment; success deletes the breaker, failure writes it again.
- `admit/<deployment>/<i>`: the deployment's capacity in blocks of `block` concurrent requests. A replica
  admits a request only within the blocks it holds, and claims a free block by creating its key on the
  replica's lease (a transaction: only if absent). A replica that dies stops renewing its lease, so etcd
  deletes its blocks after `lease_ttl_s`, and the capacity is back.
- `replicas/<id>`: this replica's pid, address and the blocks it holds, on its lease.

A request goes to the deployments in order of role (primary, then spill) and weighted chance; before its first
byte it moves on when a breaker is open, the deployment is full, or it answers a refused connection, 5xx or
529. With every deployment full it gets 429 with Retry-After. After the first byte a failed stream ends with an
SSE error event and `data: [DONE]`, never silently. Usage (requests, prompt and completion tokens, errors) per
team and key id is read from each response's `usage` (a stream is asked for it) and kept in SQLite.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import os
import random
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

OVERLOAD = (429, 529)
PROXIED = ("/v1/chat/completions", "/v1/completions")
MAX_BODY = 64 << 20


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with `prefix`."""
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


def key_id(key: str) -> str:
    """What identifies a key in etcd and in usage: its SHA-256 (the key itself is never stored)."""
    return hashlib.sha256(key.encode()).hexdigest()


def openai_error(status: int, message: str, kind: str, code: str | None = None,
                 headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": code}},
                             status=status, headers=headers)


class Etcd:
    """etcd v3 through its JSON gateway (POST /v3/...), on one of several endpoints."""

    def __init__(self, session: ClientSession, endpoints: list[str]):
        self.session = session
        self.endpoints = endpoints

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        last: Exception | None = None
        for ep in self.endpoints:
            try:
                async with self.session.post(f"{ep}/v3/{path}", json=body, timeout=ClientTimeout(total=3)) as r:
                    doc: dict[str, Any] = await r.json(content_type=None)
                    if r.status != 200:
                        raise RuntimeError(f"etcd {path}: {doc.get('message', r.status)}")
                    return doc
            except (TimeoutError, ClientError) as exc:
                last = exc
        raise RuntimeError(f"etcd unreachable: {last}")

    async def grant(self, ttl: int) -> str:
        return str((await self.call("lease/grant", {"TTL": ttl}))["ID"])

    async def keepalive(self, lease: str) -> bool:
        doc = await self.call("lease/keepalive", {"ID": lease})
        return int(doc.get("result", {}).get("TTL", 0)) > 0

    async def revoke(self, lease: str) -> None:
        await self.call("lease/revoke", {"ID": lease})

    async def put(self, key: str, value: str, lease: str | None = None) -> None:
        body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = lease
        await self.call("kv/put", body)

    async def create(self, key: str, value: str, lease: str) -> bool:
        """Put `key` only if it does not exist: whether this call created it."""
        doc = await self.call("kv/txn", {
            "compare": [{"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": b64(key), "value": b64(value), "lease": lease}}]})
        return bool(doc.get("succeeded"))

    async def delete(self, key: str) -> None:
        await self.call("kv/deleterange", {"key": b64(key)})

    async def get_prefix(self, prefix: str) -> dict[str, str]:
        doc = await self.call("kv/range", {"key": b64(prefix), "range_end": prefix_end(prefix)})
        return {unb64(kv["key"]): unb64(kv.get("value", "")) for kv in doc.get("kvs", [])}

    async def watch(self, prefix: str, on_event: Any) -> None:
        """Call on_event(key, value or None) for every change under `prefix`, for ever: when the stream breaks, on
        the next endpoint, from the revision after the last one seen (no change is lost while it moves)."""
        create: dict[str, Any] = {"key": b64(prefix), "range_end": prefix_end(prefix)}
        seen: int | None = None  # every change up to this revision was delivered
        while True:
            try:
                ep = self.endpoints[0]
                if seen is not None:
                    create["start_revision"] = str(seen + 1)
                async with self.session.post(f"{ep}/v3/watch", json={"create_request": create},
                                             timeout=ClientTimeout(total=None)) as r:
                    async for line in r.content:
                        if not line.strip():
                            continue
                        result = json.loads(line).get("result", {})
                        if result.get("created") and seen is None:
                            seen = int(result["header"]["revision"])
                        if result.get("compact_revision"):  # compacted past `seen`: from now on
                            seen = None
                            create.pop("start_revision", None)
                        for ev in result.get("events", []):
                            kv = ev["kv"]
                            value = None if ev.get("type") == "DELETE" else unb64(kv.get("value", ""))
                            on_event(unb64(kv["key"]), value)
                            seen = int(kv["mod_revision"])
            except (TimeoutError, ClientError, ValueError):
                pass
            self.endpoints = self.endpoints[1:] + self.endpoints[:1]
            await asyncio.sleep(0.2)


@dataclass
class Deployment:
    """One deployment as this replica sees it."""

    name: str
    url: str
    weight: int
    role: str
    capacity: int
    block: int
    held: set[int] = field(default_factory=set)
    inflight: int = 0
    failures: int = 0
    open_since: float | None = None  # the shared breaker, as last heard
    probing: bool = False

    @property
    def blocks(self) -> int:
        return -(-self.capacity // self.block)


class Usage:
    """Per-request usage rows in SQLite (survives a restart; `primectl usage` merges the replicas')."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        # WAL without an fsync per row: a row survives the replica's crash, not the host's power loss, and a
        # request does not wait on the disk
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS usage (ts REAL, team TEXT, key_id TEXT, deployment TEXT, "
                        "status INTEGER, prompt_tokens INTEGER, completion_tokens INTEGER)")

    def record(self, team: str, kid: str, deployment: str, status: int, usage: dict[str, Any] | None) -> None:
        u = usage or {}
        self.db.execute("INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (time.time(), team, kid[:12], deployment, status, int(u.get("prompt_tokens") or 0),
                         int(u.get("completion_tokens") or 0)))

    def summary(self, since: float) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT team, key_id, deployment, COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), "
            "SUM(CASE WHEN status >= 400 THEN 1 ELSE 0 END) FROM usage WHERE ts >= ? "
            "GROUP BY team, key_id, deployment ORDER BY team, key_id, deployment", (since,)).fetchall()
        return [{"team": t, "key_id": k, "deployment": d, "requests": n, "prompt_tokens": p or 0,
                 "completion_tokens": c or 0, "errors": e or 0} for t, k, d, n, p, c, e in rows]


class Replica:
    """The proxy, its view of the shared state, and the loops that keep it current."""

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.id: str = cfg["replica"]
        self.prefix: str = cfg["prefix"].rstrip("/") + "/"
        self.ttl = int(cfg["lease_ttl_s"])
        self.failures = int(cfg["breaker"]["failures"])
        self.cooldown = float(cfg["breaker"]["cooldown_s"])
        self.deadline = float(cfg.get("deadline_s", 600))
        self.retry_after = int(cfg.get("retry_after_s", 1))
        self.deployments = [Deployment(d["name"], d["url"].rstrip("/"), int(d["weight"]), d["role"],
                                       int(d["capacity"]), int(d["block"])) for d in cfg["deployments"]]
        self.by_name = {d.name: d for d in self.deployments}
        self.keys: dict[str, str] = {}
        self.lease = ""
        self.usage = Usage(cfg["usage_db"])
        self.session: ClientSession | None = None
        self.etcd: Etcd | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.ready = False

    # --- shared state -------------------------------------------------------------------------------------

    def _on_key(self, key: str, value: str | None) -> None:
        kid = key.removeprefix(self.prefix + "keys/")
        if value is None:
            self.keys.pop(kid, None)
        else:
            self.keys[kid] = json.loads(value).get("team", "")

    def _on_breaker(self, key: str, value: str | None) -> None:
        d = self.by_name.get(key.removeprefix(self.prefix + "breaker/"))
        if d is None:
            return
        d.open_since = None if value is None else float(json.loads(value)["since"])
        if value is None:
            d.failures = 0

    async def start(self, app: web.Application) -> None:
        # A fresh connection to the deployment per request: on a reused one, the first event of a stream often came
        # ~40 ms after its headers (measured: benchmarks/gateway_overhead.py; docs/fleet.md), a delayed-ACK stall
        # that a new connection, still in quick-ACK mode, does not have. A connect on loopback or a LAN costs less.
        self.session = ClientSession(timeout=ClientTimeout(total=None, sock_connect=5),
                                     connector=TCPConnector(force_close=True))
        self.etcd = Etcd(self.session, list(self.cfg["etcd"]))
        self.lease = await self.etcd.grant(self.ttl)
        for k, v in (await self.etcd.get_prefix(self.prefix + "keys/")).items():
            self._on_key(k, v)
        for k, v in (await self.etcd.get_prefix(self.prefix + "breaker/")).items():
            self._on_breaker(k, v)
        self.tasks = [asyncio.create_task(self.etcd.watch(self.prefix + "keys/", self._on_key)),
                      asyncio.create_task(self.etcd.watch(self.prefix + "breaker/", self._on_breaker)),
                      asyncio.create_task(self._keepalive()), asyncio.create_task(self._half_open())]
        await self._announce()
        self.ready = True

    async def stop(self, app: web.Application) -> None:
        for t in self.tasks:
            t.cancel()
        if self.etcd and self.lease:
            with contextlib.suppress(Exception):
                await self.etcd.revoke(self.lease)  # blocks back at once on a clean stop
        if self.session:
            await self.session.close()

    async def _announce(self) -> None:
        assert self.etcd
        doc = {"pid": os.getpid(), "address": f"{self.cfg['listen']['host']}:{self.cfg['listen']['port']}",
               "lease": self.lease, "ttl_s": self.ttl,
               "grants": {d.name: len(d.held) * d.block for d in self.deployments},
               "inflight": {d.name: d.inflight for d in self.deployments}}
        await self.etcd.put(f"{self.prefix}replicas/{self.id}", json.dumps(doc), self.lease)

    async def _keepalive(self) -> None:
        assert self.etcd
        while True:
            await asyncio.sleep(max(self.ttl / 3, 0.3))
            try:
                alive = await self.etcd.keepalive(self.lease)
            except RuntimeError:
                continue
            if not alive:  # expired (etcd unreachable too long): every block it held is gone
                self.lease = await self.etcd.grant(self.ttl)
                for d in self.deployments:
                    d.held.clear()
            with contextlib.suppress(RuntimeError):
                await self._announce()

    async def _half_open(self) -> None:
        """Past the cooldown of an open breaker, one replica (the one that creates the probe key) probes."""
        assert self.etcd and self.session
        while True:
            await asyncio.sleep(0.25)
            for d in self.deployments:
                if d.open_since is None or d.probing or time.time() - d.open_since < self.cooldown:
                    continue
                try:
                    if not await self.etcd.create(f"{self.prefix}probe/{d.name}", self.id, self.lease):
                        continue
                except RuntimeError:
                    continue
                d.probing = True
                try:
                    async with self.session.get(f"{d.url}/v1/models", timeout=ClientTimeout(total=5)) as r:
                        ok = r.status == 200
                except (TimeoutError, ClientError):
                    ok = False
                try:
                    if ok:
                        await self.etcd.delete(f"{self.prefix}breaker/{d.name}")
                    else:
                        await self._trip(d)
                    await self.etcd.delete(f"{self.prefix}probe/{d.name}")
                except RuntimeError:
                    pass
                d.probing = False

    async def _trip(self, d: Deployment) -> None:
        assert self.etcd
        d.open_since = time.time()
        await self.etcd.put(f"{self.prefix}breaker/{d.name}", json.dumps({"since": d.open_since, "by": self.id}))

    async def _failed(self, d: Deployment) -> None:
        d.failures += 1
        if d.failures >= self.failures and d.open_since is None:
            with contextlib.suppress(RuntimeError):
                await self._trip(d)

    async def _admit(self, d: Deployment) -> bool:
        """A slot of `d` within this replica's blocks, claiming a free block when they are all in use."""
        assert self.etcd
        if d.inflight < len(d.held) * d.block:
            d.inflight += 1
            return True
        try:
            taken = await self.etcd.get_prefix(f"{self.prefix}admit/{d.name}/")
        except RuntimeError:
            return False
        free = [i for i in range(d.blocks) if f"{self.prefix}admit/{d.name}/{i}" not in taken]
        random.shuffle(free)
        for i in free:
            with contextlib.suppress(RuntimeError):
                if await self.etcd.create(f"{self.prefix}admit/{d.name}/{i}", self.id, self.lease):
                    d.held.add(i)
                    d.inflight += 1
                    return True
        return False

    async def _release(self, d: Deployment) -> None:
        assert self.etcd
        d.inflight -= 1
        # one spare block is kept; beyond that, blocks go back as soon as they are idle
        while len(d.held) > -(-d.inflight // d.block) + 1:
            i = max(d.held)
            d.held.discard(i)
            with contextlib.suppress(RuntimeError):
                await self.etcd.delete(f"{self.prefix}admit/{d.name}/{i}")

    def _order(self) -> list[Deployment]:
        """Primaries, then spills, each by weighted chance."""
        out: list[Deployment] = []
        for role in ("primary", "spill"):
            pool = [d for d in self.deployments if d.role == role and d.weight > 0]
            while pool:
                pick = random.choices(pool, weights=[d.weight for d in pool])[0]
                out.append(pick)
                pool.remove(pick)
        return out

    # --- HTTP -----------------------------------------------------------------------------------------------

    def _team(self, request: web.Request) -> tuple[str, str] | None:
        auth = request.headers.get("Authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        kid = key_id(key) if key else ""
        return (self.keys[kid], kid) if kid in self.keys else None

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({
            "replica": self.id, "pid": os.getpid(), "ready": self.ready, "lease": self.lease,
            "deployments": {d.name: {"breaker": "closed" if d.open_since is None else "open",
                                     "inflight": d.inflight, "granted": len(d.held) * d.block,
                                     "capacity": d.capacity, "weight": d.weight, "role": d.role}
                            for d in self.deployments}}, status=200 if self.ready else 503)

    async def usage_rows(self, request: web.Request) -> web.Response:
        since = float(request.query.get("since", "0"))
        return web.json_response({"replica": self.id, "rows": self.usage.summary(since)})

    async def models(self, request: web.Request) -> web.StreamResponse:
        if self._team(request) is None:
            return openai_error(401, "missing or invalid API key", "invalid_request_error", "invalid_api_key")
        assert self.session
        for d in self._order():
            if d.open_since is not None:
                continue
            try:
                async with self.session.get(f"{d.url}{request.path}", timeout=ClientTimeout(total=5)) as r:
                    if r.status < 500:
                        return web.Response(body=await r.read(), status=r.status, content_type="application/json")
            except (TimeoutError, ClientError):
                continue
        return openai_error(503, "no deployment of this fleet is available", "server_error", "unavailable")

    async def proxy(self, request: web.Request) -> web.StreamResponse:
        who = self._team(request)
        if who is None:
            return openai_error(401, "missing or invalid API key", "invalid_request_error", "invalid_api_key")
        team, kid = who
        raw = await request.read()
        try:
            body = json.loads(raw)
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            return openai_error(400, "the request body is not a JSON object", "invalid_request_error")
        stream = bool(body.get("stream"))
        asked_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if stream and not asked_usage:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            raw = json.dumps(body).encode()
        deadline = time.monotonic() + self.deadline
        full = failed = 0
        for d in self._order():
            if d.open_since is not None or time.monotonic() > deadline:
                continue
            if not await self._admit(d):
                full += 1
                continue
            try:
                done = await self._forward(request, d, raw, stream, asked_usage, team, kid, deadline)
            finally:
                await self._release(d)
            if done is not None:
                return done
            failed += 1
        if full and not failed:
            self.usage.record(team, kid, "", 429, None)
            return openai_error(429, "every deployment of this fleet is at capacity; retry later", "rate_limit_error",
                                "capacity", headers={"Retry-After": str(self.retry_after)})
        self.usage.record(team, kid, "", 503, None)
        return openai_error(503, "no deployment of this fleet could take the request", "server_error", "unavailable")

    async def _forward(self, request: web.Request, d: Deployment, raw: bytes, stream: bool, asked_usage: bool,
                       team: str, kid: str, deadline: float) -> web.StreamResponse | None:
        """The deployment's answer relayed to the client; None (nothing sent yet) when it refused or failed."""
        assert self.session
        url = f"{d.url}{request.path}"
        try:
            upstream = await self.session.post(url, data=raw, headers={"Content-Type": "application/json"},
                                               timeout=ClientTimeout(total=max(deadline - time.monotonic(), 1)))
        except (TimeoutError, ClientError):
            await self._failed(d)
            return None
        async with upstream:
            if upstream.status >= 500 or upstream.status in OVERLOAD:
                if upstream.status not in OVERLOAD:
                    await self._failed(d)
                await upstream.read()
                return None
            d.failures = 0
            if not stream or upstream.status != 200:
                payload = await upstream.read()
                usage = None
                with contextlib.suppress(ValueError, AttributeError):
                    usage = json.loads(payload).get("usage")
                self.usage.record(team, kid, d.name, upstream.status, usage)
                return web.Response(body=payload, status=upstream.status,
                                    content_type=upstream.content_type or "application/json")
            resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                           "Cache-Control": "no-cache"})
            await resp.prepare(request)
            relay = Relay(resp, asked_usage, continuable(request.path, raw))
            failure = await relay.copy(upstream)
        tried = {d.name}
        while failure is not None and relay.continuable:
            # The stream broke after its first byte: go on from another deployment, with what was sent so far as
            # the assistant's message to continue (Dynamo's preprocessor: continue_final_message).
            await self._failed(d)
            nxt = await self._continuation(request.path, raw, relay, tried, deadline)
            if nxt is None:
                break
            d, upstream = nxt
            tried.add(d.name)
            try:
                async with upstream:
                    failure = await relay.copy(upstream, continuation=True)
            finally:
                await self._release(d)
        if failure is not None:
            if not relay.continuable:
                await self._failed(d)
            err = {"error": {"message": f"deployment {d.name} failed mid-stream ({failure}); the stream cannot go on",
                             "type": "server_error", "param": None, "code": "upstream_failed"}}
            with contextlib.suppress(ConnectionError):
                await resp.write(b"data: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n")
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        self.usage.record(team, kid, d.name, 200 if failure is None else 502, relay.usage)
        return resp

    async def _continuation(self, path: str, raw: bytes, relay: Relay, tried: set[str], deadline: float
                            ) -> tuple[Deployment, Any] | None:
        """An admitted deployment not yet tried, answering 200 to the continuation of `relay`'s stream (None: none)."""
        assert self.session
        body = relay.continuation_body(raw)
        for d in self._order():
            if d.name in tried or d.open_since is not None or time.monotonic() > deadline:
                continue
            if not await self._admit(d):
                continue
            try:
                upstream = await self.session.post(
                    f"{d.url}{path}", data=body, headers={"Content-Type": "application/json"},
                    timeout=ClientTimeout(total=max(deadline - time.monotonic(), 1)))
            except (TimeoutError, ClientError):
                await self._release(d)
                await self._failed(d)
                continue
            if upstream.status == 200:
                return d, upstream
            upstream.release()
            await self._release(d)
            tried.add(d.name)
        return None


GUIDED = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar")


def continuable(path: str, raw: bytes) -> bool:
    """Whether a broken stream of this request can go on from another deployment: a chat completion with one
    choice and no guided decoding (a continuation could not resume a grammar's state)."""
    if path != "/v1/chat/completions":
        return False
    body = json.loads(raw)
    return (body.get("n") or 1) == 1 and not any(body.get(k) for k in GUIDED)


class Relay:
    """Copies an upstream SSE stream to the client, keeping what a continuation needs: the assistant's text so
    far, how many content chunks it took, whether it finished, and the usage."""

    def __init__(self, resp: web.StreamResponse, asked_usage: bool, can_continue: bool):
        self.resp = resp
        self.asked_usage = asked_usage
        self.continuable = can_continue
        self.text = ""
        self.chunks = 0
        self.finished = False
        self.usage: dict[str, Any] | None = None

    async def copy(self, upstream: Any, continuation: bool = False) -> str | None:
        """Relay until the stream ends: None when it ended well ([DONE] or a finish_reason), else what broke it."""
        fresh = continuation
        try:
            async for raw_event in _sse_events(upstream):
                data = raw_event.strip()
                if data == b"data: [DONE]":
                    await self.resp.write(raw_event)
                    return None if self.finished or not self.continuable else "[DONE] before a finish_reason"
                event: dict[str, Any] = {}
                if data.startswith(b"data:"):
                    with contextlib.suppress(ValueError):
                        event = json.loads(data[5:])
                if event.get("usage"):
                    self.usage = event["usage"]
                choices = event.get("choices")
                if event and not choices and "usage" in event and not self.asked_usage:
                    continue  # the usage-only chunk this replica asked for
                if choices:
                    delta = choices[0].get("delta") or {}
                    if delta.get("tool_calls"):
                        self.continuable = False  # a half-streamed tool call cannot be continued as text
                    if fresh and not delta.get("content") and not choices[0].get("finish_reason"):
                        continue  # the continuation's opening role chunk: the client had one already
                    fresh = False
                    if delta.get("content"):
                        self.text += delta["content"]
                        self.chunks += 1
                    if choices[0].get("finish_reason"):
                        self.finished = True
                await self.resp.write(raw_event)
        except (TimeoutError, ClientError) as exc:
            return type(exc).__name__
        return None if self.finished else "the stream ended without a finish_reason"

    def continuation_body(self, raw: bytes) -> bytes:
        """The request again, with the text sent so far as the final assistant message to continue."""
        body = json.loads(raw)
        body["messages"] = [*body.get("messages", []), {"role": "assistant", "content": self.text}]
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
        for k in ("max_tokens", "max_completion_tokens"):
            if body.get(k):
                body[k] = max(1, int(body[k]) - self.chunks)
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return json.dumps(body).encode()


async def _sse_events(upstream: Any) -> Any:
    """The upstream body cut into whole SSE events (each ending with a blank line)."""
    buf = b""
    async for chunk in upstream.content.iter_any():
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            yield event + b"\n\n"
    if buf.strip():
        raise ClientError("the stream ended inside an event")


def app(cfg: dict[str, Any]) -> web.Application:
    """The replica's aiohttp application."""
    r = Replica(cfg)
    a = web.Application(client_max_size=MAX_BODY)
    a.on_startup.append(r.start)
    a.on_cleanup.append(r.stop)
    a.router.add_get("/-/ready", r.health)
    a.router.add_get("/health", r.health)
    a.router.add_get("/-/usage", r.usage_rows)
    a.router.add_get("/v1/models", r.models)
    for path in PROXIED:
        a.router.add_post(path, r.proxy)
    return a


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the replica's JSON config")
    args = parser.parse_args()
    with open(args.config) as f:
        cfg = json.load(f)
    # SIGTERM: stop accepting, let the streams in flight finish (up to drain_s), give the blocks back
    web.run_app(app(cfg), host=cfg["listen"]["host"], port=int(cfg["listen"]["port"]), print=None,
                access_log=None, handle_signals=True, shutdown_timeout=float(cfg.get("drain_s", 30)))


if __name__ == "__main__":
    main()
