"""A fleet gateway replica: one public OpenAI endpoint over several deployments.

Shipped to gateway hosts in the bundle, with the modules beside it (the package `fleet_gateway` there), and run
with the host runtime's Python (aiohttp, the standard library, and etcd's own JSON gateway: no primectl, no
third-party etcd client). Everything replicas share lives in the fleet's etcd, under the config's `prefix`:

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
- `limit/team/<team>/<i>`, `limit/key/<key id>/<i>`: a team's or a key's concurrency limit, in blocks the same way,
  so a limit holds fleet-wide, never per replica.
- `tokens/team/<team>/<minute>/<i>`, `tokens/key/<key id>/<minute>/<i>`: a tokens-per-minute budget, claimed in blocks
  of a sixteenth of it for the minute, on the replica's lease; a request is admitted while the replica's claimed
  tokens are not spent, and its `usage` is spent when it ends.
- `waiting/<id>`: present, on the replica's lease, while requests wait in its queue: no replica keeps an idle block
  as a spare then.
- `replicas/<id>`: this replica's pid, address and the blocks it holds, on its lease.

A request goes to the deployments in order of role (primary, then spill) and weighted chance; before its first
byte it moves on when a breaker is open, the deployment is full, or it answers a refused connection, 5xx or
529. With every deployment full it waits in a bounded queue (interactive callers before batch ones) and then gets 429
with Retry-After; a batch caller (its key's class, or `service_tier: flex`) never claims the blocks a deployment
keeps for interactive traffic (`batch_reserve`). After the first byte a failed stream ends with an
SSE error event and `data: [DONE]`, never silently. Usage (requests, prompt and completion tokens, errors) per
team and key id is read from each response's `usage` (a stream is asked for it) and kept in SQLite. `/metrics`
serves Prometheus text exposition (`Metrics`): requests, failovers, breakers, admission, latency histograms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import time
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from .admission import Budget, Caller, Deployment, Pool, expected_tokens
from .etcd import Etcd
from .metrics import Metrics
from .relay import ClientGone, Relay, continuable
from .usage import Usage

OVERLOAD = (429, 529)
PROXIED = ("/v1/chat/completions", "/v1/completions")
MAX_BODY = 64 << 20
CONNECT_S = 5  # a deployment that has not accepted a connection in this long is failed (a dark site drops the SYN)


def key_id(key: str) -> str:
    """What identifies a key in etcd and in usage: its SHA-256 (the key itself is never stored)."""
    return hashlib.sha256(key.encode()).hexdigest()


def openai_error(status: int, message: str, kind: str, code: str | None = None,
                 headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": code}},
                             status=status, headers=headers)


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
        self.stall = float(cfg.get("stall_s", 60))
        self.retry_after = int(cfg.get("retry_after_s", 1))
        queue = cfg.get("queue") or {}
        self.queue_size = int(queue.get("size", 0))
        self.queue_timeout = float(queue.get("timeout_s", 0))
        self.queued = {"interactive": 0, "batch": 0}
        self.freed = asyncio.Event()
        self.waiting: set[str] = set()  # replicas with queued requests
        self.block = int(cfg.get("block", 4))
        self.deployments = [self._deployment(d, float(cfg.get("batch_reserve", 0))) for d in cfg["deployments"]]
        self.by_name = {d.name: d for d in self.deployments}
        self.teams: dict[str, dict[str, Any]] = cfg.get("teams") or {}
        self.limits: dict[str, Pool] = {}
        self.budgets: dict[str, Budget] = {}
        self.keys: dict[str, dict[str, Any]] = {}
        self.metrics = Metrics(self.deployments)
        self.lease = ""
        self.usage = Usage(cfg["usage_db"])
        self.session: ClientSession | None = None
        self.etcd: Etcd | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.ready = False

    def _deployment(self, d: dict[str, Any], batch_reserve: float) -> Deployment:
        pool = Pool(f"{self.prefix}admit/{d['name']}/", int(d["capacity"]), int(d["block"]), spare=True)
        reserve = -(-int(pool.capacity * batch_reserve) // pool.block)  # whole blocks, rounded up
        batch = Pool(pool.path, pool.capacity, pool.block, usable=max(pool.blocks - reserve, 0))
        pool.prefer_from = batch.blocks
        return Deployment(d["name"], d["url"].rstrip("/"), int(d["weight"]), d["role"], pool, batch)

    # --- shared state -------------------------------------------------------------------------------------

    def _on_key(self, key: str, value: str | None) -> None:
        kid = key.removeprefix(self.prefix + "keys/")
        if value is None:
            self.keys.pop(kid, None)
        else:
            self.keys[kid] = json.loads(value)

    def _on_admit(self, key: str, value: str | None) -> None:
        if value is None:  # a block went back somewhere in the fleet: queued requests try again
            self._wake()

    def _on_waiting(self, key: str, value: str | None) -> None:
        who = key.removeprefix(self.prefix + "waiting/")
        if value is None:
            self.waiting.discard(who)
        elif who != self.id:
            self.waiting.add(who)
            for d in self.deployments:  # an idle spare block goes back to the fleet
                for pool in (d.pool, d.batch):
                    if pool.held and pool.inflight < pool.granted:
                        self._spawn(self._trim(pool))

    def _wake(self) -> None:
        self.freed.set()
        self.freed = asyncio.Event()

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
        self.session = ClientSession(timeout=ClientTimeout(total=None, sock_connect=CONNECT_S),
                                     connector=TCPConnector(force_close=True))
        self.etcd = Etcd(self.session, list(self.cfg["etcd"]), float(self.cfg.get("etcd_progress_s", 0)))
        self.lease = await self.etcd.grant(self.ttl)
        for k, v in (await self.etcd.get_prefix(self.prefix + "keys/")).items():
            self._on_key(k, v)
        for k, v in (await self.etcd.get_prefix(self.prefix + "breaker/")).items():
            self._on_breaker(k, v)
        for k, v in (await self.etcd.get_prefix(self.prefix + "waiting/")).items():
            self._on_waiting(k, v)
        self.tasks = [asyncio.create_task(self.etcd.watch(self.prefix + "keys/", self._on_key)),
                      asyncio.create_task(self.etcd.watch(self.prefix + "breaker/", self._on_breaker)),
                      asyncio.create_task(self.etcd.watch(self.prefix + "admit/", self._on_admit)),
                      asyncio.create_task(self.etcd.watch(self.prefix + "waiting/", self._on_waiting)),
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
               "grants": {d.name: d.granted for d in self.deployments},
               "inflight": {d.name: d.inflight for d in self.deployments}}
        await self.etcd.put(f"{self.prefix}replicas/{self.id}", json.dumps(doc), self.lease)

    async def _keepalive(self) -> None:
        assert self.etcd
        while True:
            await asyncio.sleep(max(self.ttl / 3, 0.3))
            try:
                alive = await self.etcd.keepalive(self.lease)
            except RuntimeError:
                self.metrics.inc("lease_keepalive_failures_total")
                continue
            if not alive:  # expired (etcd unreachable too long): every block it held is gone
                self.metrics.inc("lease_keepalive_failures_total")
                self.lease = await self.etcd.grant(self.ttl)
                for pool in [*(p for d in self.deployments for p in (d.pool, d.batch)), *self.limits.values()]:
                    pool.held.clear()
                for b in self.budgets.values():  # its token blocks went with the lease too
                    b.spent = 0
                    b.past.clear()
                    if b.pool:
                        b.pool.held.clear()
            await self._forget_old_minutes()
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
        self.metrics.inc("breaker_trips_total", d.name)
        await self.etcd.put(f"{self.prefix}breaker/{d.name}", json.dumps({"since": d.open_since, "by": self.id}))

    async def _failed(self, d: Deployment) -> None:
        d.failures += 1
        if d.failures >= self.failures and d.open_since is None:
            with contextlib.suppress(RuntimeError):
                await self._trip(d)

    async def _take(self, pool: Pool) -> bool:
        """One slot of `pool`: within the blocks this replica holds, else in free blocks it claims. After a lost
        lease the requests still running here count against the blocks claimed again first."""
        while pool.inflight >= pool.granted:
            # a client that leaves cancels its request, but never a claim half done: a block created in etcd and
            # not recorded here would stay taken for as long as this replica lives
            claim = asyncio.ensure_future(self._claim(pool))
            try:
                if not await asyncio.shield(claim):
                    return False
            except asyncio.CancelledError:
                claim.add_done_callback(lambda _: self._spawn(self._trim(pool)))
                raise
        pool.inflight += 1
        return True

    def _spawn(self, work: Any) -> None:
        self.tasks = [t for t in self.tasks if not t.done()]
        self.tasks.append(asyncio.ensure_future(work))

    async def _claim(self, pool: Pool) -> bool:
        """A free block of `pool`, by a create-if-absent transaction on this replica's lease."""
        assert self.etcd
        try:
            taken = await self.etcd.get_prefix(pool.path)
        except RuntimeError:
            return False
        free = [i for i in range(pool.blocks) if f"{pool.path}{i}" not in taken and i not in pool.held]
        free.sort(key=lambda i: (i < pool.prefer_from, random.random()))
        for i in free:
            with contextlib.suppress(RuntimeError):
                if await self.etcd.create(f"{pool.path}{i}", self.id, self.lease):
                    pool.held[i] = pool.size(i)
                    return True
        return False

    async def _give(self, pool: Pool) -> None:
        """A slot back; blocks go back to the fleet as soon as they are idle (a deployment's keep one spare)."""
        pool.inflight -= 1
        self._wake()
        await asyncio.shield(self._trim(pool))  # a cancelled request still gives its blocks back

    async def _trim(self, pool: Pool) -> None:
        """Give back the blocks `pool` does not need (a deployment's keeps one spare while no replica waits)."""
        assert self.etcd
        spare = pool.block if pool.spare and not self.waiting else 0
        while pool.held:
            i = max(pool.held)
            if pool.granted - pool.held[i] < pool.inflight + spare:
                break
            del pool.held[i]
            with contextlib.suppress(RuntimeError):
                await self.etcd.delete(f"{pool.path}{i}")

    async def _afford(self, budget: Budget, need: int) -> bool:
        """Whether this replica has `need` tokens of `budget` left this minute, beyond what it spent and what the
        requests it admitted may still spend, claiming blocks while it has not (then reserves them)."""
        pool = budget.for_minute(int(time.time() // 60))
        while budget.spent + budget.reserved + need > pool.granted:
            if not await self._claim(pool):
                return False
        budget.reserved += need
        return True

    async def _forget_old_minutes(self) -> None:
        """Give back this replica's token blocks of minutes gone by."""
        minute = int(time.time() // 60)
        for b in self.budgets.values():
            b.for_minute(minute)
            while b.past:
                await self._trim(b.past.pop())

    async def _say_waiting(self, waiting: bool) -> None:
        """Tell the other replicas (not) to keep spare blocks: requests wait here."""
        assert self.etcd
        with contextlib.suppress(RuntimeError):
            if waiting:
                await self.etcd.put(f"{self.prefix}waiting/{self.id}", "1", self.lease)
            else:
                await self.etcd.delete(f"{self.prefix}waiting/{self.id}")

    def _caller_limits(self, caller: Caller) -> list[tuple[str, dict[str, Any], str]]:
        """(what, limits, etcd name) for the caller's team and key, where they have limits."""
        out = []
        if self.teams.get(caller.team):
            out.append((f"team {caller.team}", self.teams[caller.team], f"team/{caller.team}"))
        if caller.limits:
            out.append((f"key {caller.kid[:12]}", caller.limits, f"key/{caller.kid}"))
        return out

    async def _hold_limits(self, caller: Caller, need: int, reserved: list[tuple[Budget, int, int]]
                           ) -> list[Pool] | web.Response:
        """The caller's team and key concurrency slots (to give back when the request ends), its `need` tokens
        reserved from their budgets (added to `reserved` as (budget, minute, tokens), to release when it ends), or
        the 429 that says which limit it is over."""
        held: list[Pool] = []
        refusal: web.Response | None = None
        for what, limits, name in self._caller_limits(caller):
            per_minute = limits.get("tokens_per_minute")
            if per_minute:
                budget = self.budgets.get(name)
                if budget is None or budget.per_minute != per_minute:
                    budget = self.budgets[name] = Budget(f"{self.prefix}tokens/{name}/", int(per_minute))
                if need > budget.per_minute:  # no minute would do: retrying cannot help
                    refusal = openai_error(429, f"the request may take {need} tokens, more than {what}'s "
                                                f"{budget.per_minute} a minute", "rate_limit_error", "tokens_per_minute")
                    break
                if not await self._afford(budget, need):
                    wait = str(max(1, 60 - int(time.time() % 60)))
                    refusal = openai_error(429, f"{what} has used its tokens per minute; retry later",
                                           "rate_limit_error", "tokens_per_minute", headers={"Retry-After": wait})
                    break
                reserved.append((budget, budget.minute, need))
            most = limits.get("max_concurrency")
            if most:
                pool = self.limits.get(name)
                if pool is None or pool.capacity != most:
                    pool = self.limits[name] = Pool(f"{self.prefix}limit/{name}/", int(most), min(self.block, int(most)))
                if not await self._take(pool):
                    refusal = openai_error(429, f"{what} is at its concurrency limit ({most}); retry later",
                                           "rate_limit_error", "concurrency",
                                           headers={"Retry-After": str(self.retry_after)})
                    break
                held.append(pool)
        if refusal is None:
            return held
        for p in held:
            await self._give(p)
        self._release(reserved)
        return refusal

    @staticmethod
    def _release(reserved: list[tuple[Budget, int, int]]) -> None:
        for budget, minute, tokens in reserved:
            budget.release(minute, tokens)
        reserved.clear()

    def _spend(self, caller: Caller, usage: dict[str, Any] | None) -> None:
        tokens = int((usage or {}).get("prompt_tokens") or 0) + int((usage or {}).get("completion_tokens") or 0)
        for _, _, name in self._caller_limits(caller):
            if name in self.budgets:
                self.budgets[name].spent += tokens

    def _record(self, caller: Caller, deployment: str, status: int, usage: dict[str, Any] | None) -> None:
        self.usage.record(caller.team, caller.kid, deployment, status, usage)
        self._spend(caller, usage)

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

    def _caller(self, request: web.Request) -> Caller | None:
        auth = request.headers.get("Authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        kid = key_id(key) if key else ""
        record = self.keys.get(kid)
        if record is None:
            return None
        limits = {k: record[k] for k in ("max_concurrency", "tokens_per_minute") if record.get(k)}
        return Caller(record.get("team", ""), kid, record.get("class") == "batch", limits)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({
            "replica": self.id, "pid": os.getpid(), "ready": self.ready, "lease": self.lease,
            "deployments": {d.name: {"breaker": "closed" if d.open_since is None else "open",
                                     "inflight": d.inflight, "granted": d.granted,
                                     "capacity": d.capacity, "weight": d.weight, "role": d.role}
                            for d in self.deployments},
            "queued": dict(self.queued),
            "limits": {name: {"inflight": p.inflight, "granted": p.granted, "capacity": p.capacity}
                       for name, p in self.limits.items()}}, status=200 if self.ready else 503)

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.text().encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def usage_rows(self, request: web.Request) -> web.Response:
        since = float(request.query.get("since", "0"))
        return web.json_response({"replica": self.id, "rows": self.usage.summary(since)})

    async def models(self, request: web.Request) -> web.StreamResponse:
        if self._caller(request) is None:
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
        caller = self._caller(request)
        if caller is None:
            return openai_error(401, "missing or invalid API key", "invalid_request_error", "invalid_api_key")
        raw = await request.read()
        try:
            body = json.loads(raw)
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            return openai_error(400, "the request body is not a JSON object", "invalid_request_error")
        stream = bool(body.get("stream"))
        asked_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        rewrite = False
        if body.get("service_tier") == "flex":  # OpenAI's name for the cheaper, slower class: batch here
            caller.batch = True
            del body["service_tier"]
            rewrite = True
        if stream and not asked_usage:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            rewrite = True
        if rewrite:
            raw = json.dumps(body).encode()
        reserved: list[tuple[Budget, int, int]] = []
        held = await self._hold_limits(caller, expected_tokens(body), reserved)
        if isinstance(held, web.Response):
            self._record(caller, "", 429, None)
            return held
        try:
            return await self._route(request, caller, raw, stream, asked_usage)
        except asyncio.CancelledError:  # the client went away: its slots come back below, its upstream is closed
            self._record(caller, "", 499, None)
            raise
        finally:
            self._release(reserved)  # its usage, spent when it was recorded, takes the reservation's place
            for pool in held:
                await self._give(pool)

    async def _route(self, request: web.Request, caller: Caller, raw: bytes, stream: bool,
                     asked_usage: bool) -> web.StreamResponse:
        """The request sent to the deployments in order, waiting in the queue while every one is full."""
        deadline = time.monotonic() + self.deadline
        give_up = min(deadline, time.monotonic() + self.queue_timeout)
        klass = "batch" if caller.batch else "interactive"
        queued = False
        try:
            while True:
                full = failed = 0
                if caller.batch and self.queued["interactive"]:  # interactive callers waiting go first
                    full = 1
                else:
                    for d in self._order():
                        if d.open_since is not None or time.monotonic() > deadline:
                            continue
                        if not await self._take(d.pool_for(caller)):
                            full += 1
                            continue
                        try:
                            done = await self._forward(request, d, raw, stream, asked_usage, caller, deadline)
                        finally:
                            await self._give(d.pool_for(caller))
                        if done is not None:
                            return done
                        failed += 1
                    if failed or not full:
                        break
                if time.monotonic() >= give_up:
                    break
                if not queued:
                    if sum(self.queued.values()) >= self.queue_size:
                        break
                    queued = True
                    self.queued[klass] += 1
                    if sum(self.queued.values()) == 1:
                        await self._say_waiting(True)
                freed = self.freed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(freed.wait(), timeout=min(0.5, max(give_up - time.monotonic(), 0.01)))
        finally:
            if queued:
                self.queued[klass] -= 1
                if not sum(self.queued.values()):
                    await self._say_waiting(False)
        if full and not failed:
            self._record(caller, "", 429, None)
            return openai_error(429, "every deployment of this fleet is at capacity; retry later", "rate_limit_error",
                                "capacity", headers={"Retry-After": str(self.retry_after)})
        self._record(caller, "", 503, None)
        return openai_error(503, "no deployment of this fleet could take the request", "server_error", "unavailable")

    def _upstream_timeout(self, deadline: float, stream: bool) -> ClientTimeout:
        """What one request to a deployment may take: what is left of its deadline, CONNECT_S to connect, and for a
        stream `stall_s` without a byte (a deployment cut off drops packets and refuses nothing: without these its
        requests would wait out the deadline). A non-streamed answer comes whole at its end, so silence tells
        nothing there. A request's timeout replaces the session's whole."""
        return ClientTimeout(total=max(deadline - time.monotonic(), 1), sock_connect=CONNECT_S,
                             sock_read=self.stall if stream else None)

    async def _forward(self, request: web.Request, d: Deployment, raw: bytes, stream: bool, asked_usage: bool,
                       caller: Caller, deadline: float) -> web.StreamResponse | None:
        """The deployment's answer relayed to the client; None (nothing sent yet) when it refused or failed."""
        assert self.session
        url = f"{d.url}{request.path}"
        try:
            upstream = await self.session.post(url, data=raw, headers={"Content-Type": "application/json"},
                                               timeout=self._upstream_timeout(deadline, stream))
        except (TimeoutError, ClientError):
            await self._failed(d)
            self.metrics.inc("failovers_total", d.name)
            return None
        async with upstream:
            if upstream.status >= 500 or upstream.status in OVERLOAD:
                if upstream.status not in OVERLOAD:
                    await self._failed(d)
                await upstream.read()
                self.metrics.inc("failovers_total", d.name)
                return None
            d.failures = 0
            request["deployment"] = d.name
            if not stream or upstream.status != 200:
                payload = await upstream.read()
                usage = None
                with contextlib.suppress(ValueError, AttributeError):
                    usage = json.loads(payload).get("usage")
                self._record(caller, d.name, upstream.status, usage)
                return web.Response(body=payload, status=upstream.status,
                                    content_type=upstream.content_type or "application/json")
            resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                           "Cache-Control": "no-cache"})
            await resp.prepare(request)
            relay = Relay(resp, asked_usage, continuable(request.path, raw))
            try:
                failure = await relay.copy(upstream)
            except ClientGone:
                self._record(caller, d.name, 499, relay.usage)
                return resp
            finally:
                request["first_event"] = relay.first
        tried = {d.name}
        while failure is not None and relay.continuable:
            # The stream broke after its first byte: go on from another deployment, with what was sent so far as
            # the assistant's message to continue (Dynamo's preprocessor: continue_final_message).
            await self._failed(d)
            nxt = await self._continuation(request.path, raw, relay, tried, deadline, caller)
            if nxt is None:
                break
            self.metrics.inc("continuations_total", d.name)
            d, upstream = nxt
            tried.add(d.name)
            try:
                async with upstream:
                    failure = await relay.copy(upstream, continuation=True)
            except ClientGone:
                self._record(caller, d.name, 499, relay.usage)
                return resp
            finally:
                await self._give(d.pool_for(caller))
        if failure is not None:
            self.metrics.inc("stream_errors_total", d.name)
            if not relay.continuable:
                await self._failed(d)
            err = {"error": {"message": f"deployment {d.name} failed mid-stream ({failure}); the stream cannot go on",
                             "type": "server_error", "param": None, "code": "upstream_failed"}}
            with contextlib.suppress(ConnectionError):
                await resp.write(b"data: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n")
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        self._record(caller, d.name, 200 if failure is None else 502, relay.usage)
        return resp

    async def _continuation(self, path: str, raw: bytes, relay: Relay, tried: set[str], deadline: float,
                            caller: Caller) -> tuple[Deployment, Any] | None:
        """An admitted deployment not yet tried, answering 200 to the continuation of `relay`'s stream (None: none)."""
        assert self.session
        body = relay.continuation_body(raw)
        for d in self._order():
            if d.name in tried or d.open_since is not None or time.monotonic() > deadline:
                continue
            if not await self._take(d.pool_for(caller)):
                continue
            try:
                upstream = await self.session.post(
                    f"{d.url}{path}", data=body, headers={"Content-Type": "application/json"},
                    timeout=self._upstream_timeout(deadline, stream=True))
            except (TimeoutError, ClientError):
                await self._give(d.pool_for(caller))
                await self._failed(d)
                continue
            if upstream.status == 200:
                return d, upstream
            upstream.release()
            await self._give(d.pool_for(caller))
            tried.add(d.name)
        return None


def app(cfg: dict[str, Any]) -> web.Application:
    """The replica's aiohttp application."""
    r = Replica(cfg)
    a = web.Application(client_max_size=MAX_BODY, middlewares=[r.metrics.middleware])
    a.on_startup.append(r.start)
    a.on_cleanup.append(r.stop)
    a.router.add_get("/-/ready", r.health)
    a.router.add_get("/health", r.health)
    a.router.add_get("/-/usage", r.usage_rows)
    a.router.add_get("/metrics", r.metrics_page)
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
    # handler_cancellation: a client that goes away cancels its request, so its slot and the deployment's work on it
    # end at once, not when the deployment finishes an answer nobody reads
    web.run_app(app(cfg), host=cfg["listen"]["host"], port=int(cfg["listen"]["port"]), print=None,
                access_log=None, handle_signals=True, shutdown_timeout=float(cfg.get("drain_s", 30)),
                handler_cancellation=True)

