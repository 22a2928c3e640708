"""The controller's side of the fleet's etcd: etcd v3's own JSON gateway (POST /v3/...), over urllib.

etcd 3.4 serves its gRPC API as JSON on the client port, so the controller needs no etcd client library (the
once-usual `etcd3` package no longer imports with protobuf >= 4); the gateway replicas speak the same API over
aiohttp (gateway/etcd.py).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any

from primectl.errors import DeployError


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _range_end(prefix: str) -> str:
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


class Etcd:
    """A few etcd v3 calls against the first endpoint that answers."""

    def __init__(self, endpoints: list[str], timeout_s: float = 5.0):
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST one call; DeployError naming the endpoints when none answers. An endpoint that fails goes last for
        the calls after it, so a member that is cut off costs one timeout, not one a call."""
        errors = []
        for ep in list(self.endpoints):
            req = urllib.request.Request(f"{ep}/v3/{path}", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    doc: dict[str, Any] = json.loads(resp.read())
                    return doc
            except (urllib.error.URLError, OSError, ValueError) as exc:
                errors.append(f"{ep}: {getattr(exc, 'reason', exc)}")
                self.endpoints = [e for e in self.endpoints if e != ep] + [ep]
        raise DeployError(f"the fleet's etcd does not answer ({'; '.join(errors)}); is the gateway up?",
                          service="gateway-etcd")

    def put(self, key: str, value: str) -> None:
        """Set `key`."""
        self.call("kv/put", {"key": _b64(key), "value": _b64(value)})

    def delete(self, key: str) -> int:
        """Delete `key`: how many keys went."""
        return int(self.call("kv/deleterange", {"key": _b64(key)}).get("deleted", 0))

    def prefix(self, prefix: str) -> dict[str, str]:
        """Every key under `prefix` with its value."""
        doc = self.call("kv/range", {"key": _b64(prefix), "range_end": _range_end(prefix)})
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
                for kv in doc.get("kvs", [])}
