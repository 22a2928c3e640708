"""Relaying a deployment's SSE stream to the client, and what continuing a broken stream on another deployment
needs."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from aiohttp import ClientError, web

GUIDED = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar")


def continuable(path: str, raw: bytes) -> bool:
    """Whether a broken stream of this request can go on from another deployment: a chat completion with one
    choice and no guided decoding (a continuation could not resume a grammar's state)."""
    if path != "/v1/chat/completions":
        return False
    body = json.loads(raw)
    return (body.get("n") or 1) == 1 and not any(body.get(k) for k in GUIDED)


class ClientGone(Exception):
    """The client closed its connection: nothing more can be sent to it, and no deployment is to blame."""


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
        self.first: float | None = None  # when the client got its first event

    async def copy(self, upstream: Any, continuation: bool = False) -> str | None:
        """Relay until the stream ends: None when it ended well ([DONE] or a finish_reason), else what broke it."""
        fresh = continuation
        try:
            async for raw_event in _sse_events(upstream):
                data = raw_event.strip()
                if data == b"data: [DONE]":
                    await self._send(raw_event)
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
                await self._send(raw_event)
                self.first = self.first or time.monotonic()
        except (TimeoutError, ClientError) as exc:
            return type(exc).__name__
        return None if self.finished else "the stream ended without a finish_reason"

    async def _send(self, data: bytes) -> None:
        try:
            await self.resp.write(data)
        except ConnectionError as exc:  # aiohttp's ClientConnectionResetError is one, and a ClientError too
            raise ClientGone() from exc

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
