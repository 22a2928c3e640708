"""The losses Dynamo 1.6.1 still allows while `up` changes a generation, and how the frontend's log tells each one
(docs/live-changes.md, "What a change can still lose"). primectl's rollout does not close them yet: they happen inside the
frontend, in a window of a few milliseconds."""

from __future__ import annotations

# What the openai client reports for each, before any byte of the answer.
ANSWERED_503 = "HTTP 503: Error code: 503 - Service temporarily unavailable"
ANSWERED_500 = "HTTP 500: Error code: 500 - Failed to generate completions"
ANSWERS = (ANSWERED_503, ANSWERED_500)

# Each race by the line of the frontend's log that names it.
RACES = {
    # The new generation's decode twin registered and took a request while the frontend's prefill router for
    # that generation's namespace was still activating; the migration's 3 retries fail the same way at once (503).
    "new generation's prefill router still activating": "is still activating",
    # The router had picked an old prefill worker as it left discovery at its drain's SIGTERM (503).
    "old prefill worker left discovery": "Remote prefill failed, failing request",
    # The old generation's last decode worker left discovery between the frontend choosing that generation's
    # worker set by its count (WorkerSetManager::select_weighted) and routing in it: an empty set (500).
    "old generation's last decode worker left as it was chosen": "no endpoints available to route work",
}


def race_causes(frontend_log: str) -> dict[str, int]:
    """How many 503s and 500s the frontend sent in `frontend_log`, and how many of each of RACES its log shows."""
    out = {"503 sent": frontend_log.count("http response sent status=503"),
           "500 sent": frontend_log.count("http response sent status=500")}
    for cause, needle in RACES.items():
        if needle == "is still activating":  # one line per retry: count the requests whose retries ran out
            out[cause] = sum("migration retries exhausted" in line and "worker_unavailable" in line
                             for line in frontend_log.splitlines())
        else:
            out[cause] = frontend_log.count(needle)
    return out
