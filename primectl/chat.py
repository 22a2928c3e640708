"""`primectl chat`: one streamed chat turn against a deployment's endpoint, through the openai client."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from primectl.errors import DeployError
from primectl.plan.model import Plan


def stream_chat(plan: Plan, message: str, *, max_tokens: int, out: TextIO | None = None) -> tuple[int, float]:
    """Stream the answer to `message` to `out` as it arrives; (content chunks, seconds). DeployError when it fails."""
    out = out or sys.stdout
    try:
        from openai import OpenAI, OpenAIError
    except ImportError:
        raise DeployError("primectl chat needs the openai package: pip install 'primectl[smoke]'") from None
    client = OpenAI(base_url=plan.endpoint + "/v1", api_key="none", max_retries=0,
                    timeout=max(60.0, plan.serving.capabilities.first_request_timeout_s))
    t0 = time.monotonic()
    chunks = 0
    try:
        stream = client.chat.completions.create(model=plan.served_model, messages=[{"role": "user", "content": message}],
                                                max_tokens=max_tokens, stream=True)
        for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    out.write(choice.delta.content)
                    out.flush()
                    chunks += 1
    except OpenAIError as exc:
        raise DeployError(f"chat with {plan.served_model} at {plan.endpoint} failed: {exc}") from None
    out.write("\n")
    return chunks, time.monotonic() - t0
