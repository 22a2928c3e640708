"""`make demo-fleet`'s last step: one chat and one streamed chat through the fleet's public endpoint.

A key for team `demo` is created for the check and revoked after it (never printed). Exit 1 when either
answer is missing.
"""

from __future__ import annotations

import sys

from openai import OpenAI

from primectl.fleet import commands
from primectl.fleet.plan import plan_fleet


def main(recipe: str) -> int:
    fleet = plan_fleet(recipe)
    key = commands.create_key(fleet, "demo", "make demo-fleet check")
    try:
        client = OpenAI(base_url=f"{fleet.endpoint}/v1", api_key=key, max_retries=0, timeout=60)
        r = client.chat.completions.create(model=fleet.served_model, max_tokens=12,
                                           messages=[{"role": "user", "content": "Say hello."}])
        print(f"chat through {fleet.endpoint}: {r.choices[0].message.content!r}")
        stream = client.chat.completions.create(model=fleet.served_model, max_tokens=12, stream=True,
                                                messages=[{"role": "user", "content": "Count to three."}])
        finish = [c.choices[0].finish_reason for c in stream if c.choices and c.choices[0].finish_reason]
        print(f"streamed chat: finish_reason {finish[-1] if finish else 'MISSING'}")
        return 0 if r.choices[0].message.content and finish else 1
    finally:
        commands.revoke_key(fleet, commands.key_id(key)[:16])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "recipes/demo-fleet.yaml"))
