"""etcd v3 for a gateway replica: through etcd's own JSON gateway (POST /v3/...) on aiohttp, no third-party client."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with `prefix`."""
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


CALL_TIMEOUT = ClientTimeout(total=3, sock_connect=1)  # the members share a site: a second to connect is plenty


class Etcd:
    """etcd v3 through its JSON gateway (POST /v3/...), on one of several endpoints."""

    def __init__(self, session: ClientSession, endpoints: list[str], progress_s: float = 0):
        self.session = session
        self.endpoints = list(endpoints)  # calls go to the first, the one that answered last
        self.watched = list(endpoints)  # the watch's own order
        self.progress_s = progress_s  # the members' watch progress interval (0: they send none)

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One request, to the member that answered last, then to the others in turn. A member that fails goes to
        the end, so one cut off (it drops packets: each call would wait out the timeout) costs one call's timeout,
        not every call's."""
        last: Exception | None = None
        for ep in list(self.endpoints):
            try:
                async with self.session.post(f"{ep}/v3/{path}", json=body, timeout=CALL_TIMEOUT) as r:
                    doc: dict[str, Any] = await r.json(content_type=None)
                    if r.status != 200:
                        raise RuntimeError(f"etcd {path}: {doc.get('message', r.status)}")
                    return doc
            except (TimeoutError, ClientError) as exc:
                last = exc
                self.endpoints = [e for e in self.endpoints if e != ep] + [ep]
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
        the next endpoint, from the revision after the last one seen (no change is lost while it moves). With
        `progress_s`, the watch asks for progress notifications and counts a member silent for three of them as
        lost: one cut off breaks no stream, it only stops sending."""
        create: dict[str, Any] = {"key": b64(prefix), "range_end": prefix_end(prefix)}
        if self.progress_s:
            create["progress_notify"] = True
        timeout = ClientTimeout(total=None, sock_connect=1, sock_read=3 * self.progress_s or None)
        seen: int | None = None  # every change up to this revision was delivered
        while True:
            try:
                ep = self.watched[0]
                if seen is not None:
                    create["start_revision"] = str(seen + 1)
                async with self.session.post(f"{ep}/v3/watch", json={"create_request": create},
                                             timeout=timeout) as r:
                    async for line in r.content:
                        if not line.strip():
                            continue
                        result = json.loads(line).get("result", {})
                        if result.get("created") and seen is None:
                            seen = int(result["header"]["revision"])
                        elif seen is not None and result.get("header") and not any(
                                result.get(k) for k in ("created", "canceled", "events", "compact_revision")):
                            # a progress notification: every change up to its revision was sent
                            seen = max(seen, int(result["header"]["revision"]))
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
            self.watched = self.watched[1:] + self.watched[:1]
            await asyncio.sleep(0.2)
