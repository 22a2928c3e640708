"""Bridge for ONE upstream gap: ``python -m dynamo.mocker`` (ai-dynamo 1.6.1) does not tell the frontend its
context limit is a hard one, so a prompt over it is a 500 instead of a 400.

The gap. Dynamo 1.6.1's frontend counts a request's prompt tokens with the model's tokenizer, and refuses one
over the limit itself (HTTP 400, ``{"message": "Invalid request", ..., "details": {"type": "context_length",
"limit": N, "actual": M}}``) only for the overflow kinds a worker advertises in its model card: the
``token_budget`` entry of the card's runtime config (``dynamo/common/token_budget.py``: ``TokenBudget``,
``publish_token_budget``; ai-dynamo/dynamo PR #12092, "reject over-context requests before streaming"). Without
the entry it leaves the length to the engine. ``dynamo.vllm`` publishes it (``dynamo/vllm/capacity.py``,
``publish_vllm_token_budget``: the whole ``max_model_len``, prompt and total overflow both refused). The mocker's
``build_runtime_config`` (``dynamo/mocker/config.py``) sets ``context_length = max_model_len`` and publishes no
budget. The prompt then reaches the mocker, whose admission control refuses it (aisimulate: "rejecting request
that exceeds a worker admission limit", ``prompt_len >= max_model_len``, PR #11069); the frontend answers that
with 500 ``Internal server error`` (``backend_status`` 500), after first trying the request again on other
workers ``--migration-limit`` times, since a worker-local rejection counts as migratable.

What this does. Before running ``dynamo.mocker`` exactly as ``python -m`` would (``runpy``,
``run_name="__main__"``), it wraps ``dynamo.mocker.main.build_runtime_config`` so that the runtime config it
returns also carries the mocker's own contract, through Dynamo's own ``publish_token_budget``:
``TokenBudget(combined_limit=max_model_len, reject_prompt_overflow=True, reject_total_overflow=False)``. That is
what the mocker enforces: it refuses a prompt at or over ``max_model_len``, and ends a generation that reaches
the limit with ``finish_reason="length"`` rather than refusing prompt + ``max_tokens`` over it (PR #11069). So the
frontend refuses early only what the engine would refuse anyway, with the body that a vLLM worker's deployment
gets. Without ``max_model_len`` (``--max-model-len`` not given) the mocker has no limit and nothing is published.
Nothing in site-packages is edited.

How it is applied. The runtime venv runs it without primectl: ``python PATH/dynamo_mocker_token_budget_bridge.py
ARGS...`` behaves as ``python -m dynamo.mocker ARGS...``. It imports only the standard library at module level
and Dynamo's own modules (in the runtime it bridges) when it runs. If the pinned Dynamo moves and the hook or
``publish_token_budget`` is gone, it exits 2 saying so, instead of starting a mocker whose long prompts get 500.

When to delete it. ``tests/test_dynamo_mocker_token_budget_bridge.py`` fails once the runtime's own
``build_runtime_config`` publishes a ``token_budget`` (the gap closed upstream), and when the runtime lock moves
off the version this was checked against.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections.abc import Callable, Mapping
from typing import Any

#: The versions the gap was found in (runtime lock scripts/runtime-requirements-cpu.txt).
CHECKED_AGAINST = {"ai-dynamo": "1.6.1", "ai-dynamo-runtime": "1.6.1"}
#: What ``python -m`` would run.
TARGET = "dynamo.mocker"
#: The module whose ``build_runtime_config`` the bridge wraps (the name ``launch_workers`` calls).
HOOK_MODULE = "dynamo.mocker.main"
HOOK = "build_runtime_config"
#: Must match ``TOKEN_BUDGET_RUNTIME_KEY`` in Dynamo (``dynamo.common.token_budget``).
BUDGET_KEY = "token_budget"

RuntimeConfigBuilder = Callable[[Mapping[str, Any]], tuple[int, Any]]


def mocker_limit(engine_args: Mapping[str, Any]) -> int | None:
    """The mocker's ``max_model_len`` from its normalised engine args (``engine.max_model_len``), or None."""
    limit = engine_args.get("engine", {}).get("max_model_len")
    return int(limit) if limit else None


def with_budget(build: RuntimeConfigBuilder) -> RuntimeConfigBuilder:
    """``build`` whose runtime config also advertises the mocker's token budget (when it has a limit)."""
    from dynamo.common.token_budget import TokenBudget, publish_token_budget

    def build_with_budget(engine_args: Mapping[str, Any]) -> tuple[int, Any]:
        block_size, runtime_config = build(engine_args)
        limit = mocker_limit(engine_args)
        if limit is not None:
            publish_token_budget(runtime_config, TokenBudget(
                combined_limit=limit, reject_prompt_overflow=True, reject_total_overflow=False))
        return block_size, runtime_config

    build_with_budget.__wrapped__ = build  # type: ignore[attr-defined]
    return build_with_budget


def published_budget(runtime_config: Any) -> dict[str, Any] | None:
    """The ``token_budget`` a runtime config carries, decoded, or None.

    ``runtime_data`` maps each engine-specific key to its JSON text (``get_engine_specific`` reads string values
    only, and the budget is an object)."""
    raw = dict(runtime_config.runtime_data).get(BUDGET_KEY)
    if raw is None:
        return None
    return dict(json.loads(raw) if isinstance(raw, str) else raw)


def install() -> None:
    """Wrap the hook in the imported mocker (idempotent). Exits 2 naming what is missing if Dynamo moved."""
    import importlib

    try:
        module = importlib.import_module(HOOK_MODULE)
        build = getattr(module, HOOK)
        importlib.import_module("dynamo.common.token_budget")
    except (ImportError, AttributeError) as exc:
        print(f"dynamo_mocker_token_budget_bridge: {HOOK_MODULE}.{HOOK} or dynamo.common.token_budget is gone "
              f"({exc}); checked against {CHECKED_AGAINST}: re-check the gap and update or drop the bridge",
              file=sys.stderr)
        sys.exit(2)
    if getattr(build, "__wrapped__", None) is None:
        setattr(module, HOOK, with_budget(build))


def main() -> None:
    """``python THIS_FILE ARGS`` == ``python -m dynamo.mocker ARGS`` with the bridge installed.

    As with ``-m``, ``sys.path[0]`` becomes the working directory rather than this file's directory.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        sys.path[0] = os.getcwd()
    install()
    runpy.run_module(TARGET, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
