"""A gateway replica's usage rows: one per request, in SQLite."""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any


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
