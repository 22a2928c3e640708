"""A fleet of two demo deployments ("sites") behind the gateway, for real (issue 39).

Two copies of recipes/demo-site-{a,b}.yaml (Dynamo's mocker behind real Dynamo frontends and HAProxy, ports
and workdirs of their own), each site in a network namespace of its own reached over SSH across a veth link
(tests/integration/netns_sites.py), and a `kind: fleet` recipe over them go `up` with the process supervisor: the
gateway's own etcd, two gateway replicas (primectl/fleet/gateway/ on the host runtime's aiohttp) and HAProxy
in front of them. Through the `openai` client, with a key from `primectl keys create`:

- no key: 401 with an OpenAI error body; with the key: chat and streaming chat answered;
- the key appears in no file under any workdir (logs, configs, usage database) and in no `plan`/`diff` output;
- site a lost as a site is: its link cut (nothing answers, nothing refuses) and every process there SIGKILLed:
  requests keep being answered (failover before the first byte), streams that were on it go on from site b once
  it has sent nothing for `stall_s`, the shared breaker opens in etcd and both replicas apply it; with the link
  back, `up` of site a brings it back and one replica's half-open probe closes the breaker;
- more concurrent streams than the fleet admits: each one is served or answered 429 with Retry-After, and the
  admitted count never passes capacity + replicas x block;
- a request that finds the fleet full waits in a replica's queue and is served when a client closes its stream;
  streams the clients cancel leave no slot taken;
- a team's concurrency limit and tokens per minute hold across both replicas, and answers running at once cannot
  spend past a key's tokens per minute (each reserves its expected tokens); a batch key never takes the slots
  kept for interactive traffic;
- a replica SIGKILLed: its blocks are back within its lease TTL + 1 s;
- `primectl usage --by team` counts the team's requests and tokens from both replicas; `down` leaves nothing.

Run inside a loopback-only network namespace:

    unshare --net -- sh -c 'ip link set lo up && \\
        PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python .venv/bin/pytest tests/integration/test_fleet_demo.py -q'
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from primectl.bench.fleet_copy import SITES, FleetCopy, write_fleet

from .fleetkit import cli, fleet_up
from .netns_sites import Site, reach, sites_up
from .sshhosts import netns_problem

pytestmark = pytest.mark.integration

RUN = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python "
       ".venv/bin/pytest tests/integration/test_fleet_demo.py -q'")
EDGE = 19_400
REPLICA = EDGE + 10
CAPACITY = 4  # per site: small, so that the overload test fills it
BLOCK = 1
TTL = 2
QUEUED = 3  # seconds a request waits in a replica's queue for a slot
TPM = 400  # team metered's tokens per minute
STALL = 8  # seconds a deployment may send nothing before its request or stream moves on (above the 600 KB TTFT)


@dataclass
class Fleet:
    copy: FleetCopy
    site: dict[str, Site]
    key: str = ""

    @property
    def recipe(self) -> Path:
        return self.copy.recipe

    @property
    def sites(self) -> dict[str, Path]:
        return self.copy.sites

    @property
    def workdirs(self) -> list[Path]:
        return list(self.copy.workdirs.values())




def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def replicas_health() -> list[dict]:
    out = []
    for i in range(2):
        try:
            out.append(get(f"http://127.0.0.1:{REPLICA + i}/health"))
        except OSError:
            out.append({})
    return out


def client(key: str):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=f"http://127.0.0.1:{EDGE}/v1", api_key=key, max_retries=0, timeout=60)




@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    # site a weighs more, so that the site-loss test finds a stream on it within CAPACITY streams (all of them on
    # site b: 1 in 256) and site b keeps a free slot to continue it on
    root = tmp_path_factory.mktemp("fleet")
    problem = netns_problem(RUN)
    if problem:
        pytest.fail(problem, pytrace=False)
    with sites_up(root / "netns", SITES) as sites:
        copy = write_fleet(root, port=EDGE, name="testfleet", capacity=CAPACITY, block=BLOCK, lease_ttl_s=TTL,
                           weights=(3, 1), admission={"queue": 1, "queue_timeout_s": QUEUED}, stall_s=STALL,
                           teams={"capped": {"max_concurrency": 2}, "metered": {"tokens_per_minute": TPM}},
                           site_hosts=reach(sites, root / "known_hosts"))
        with fleet_up(copy, RUN):
            yield Fleet(copy, sites)


def test_a_key_is_needed_and_then_chat_and_streams_are_answered(fleet: Fleet) -> None:
    import openai

    made = cli("keys", "create", fleet.recipe, "--team", "research")
    assert made.returncode == 0, made.stderr
    fleet.key = made.stdout.strip()
    assert fleet.key.startswith("pk-") and fleet.key not in made.stderr

    with pytest.raises(openai.AuthenticationError) as no_key:
        client("pk-not-a-key").chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}])
    assert no_key.value.status_code == 401 and "invalid API key" in str(no_key.value)

    c = client(fleet.key)
    r = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert r.choices[0].message.content and r.usage and r.usage.prompt_tokens > 0
    chunks = list(c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                            stream=True))
    assert chunks[-1].choices and chunks[-1].choices[0].finish_reason, chunks[-1]
    assert all(ch.choices for ch in chunks), "the usage-only chunk the client did not ask for reached it"

    status = cli("status", fleet.recipe, "-o", "json")
    assert status.returncode == 0, status.stdout + status.stderr
    doc = json.loads(status.stdout)
    assert [(d["name"], d["breaker"]) for d in doc["deployments"]] == [("testfleet-site-a", "closed"),
                                                                       ("testfleet-site-b", "closed")]
    assert all(r["ready"] and r["pid"] for r in doc["replicas"]) and doc["endpoint"] == f"http://127.0.0.1:{EDGE}"
    listed = cli("keys", "list", fleet.recipe, "-o", "json")
    assert [k["team"] for k in json.loads(listed.stdout)] == ["research"] and fleet.key not in listed.stdout


def inflight(site: str) -> int:
    return sum(h.get("deployments", {}).get(site, {}).get("inflight", 0) for h in replicas_health())


def test_losing_a_site_loses_no_request_and_its_breaker_opens_on_every_replica(fleet: Fleet) -> None:
    c = client(fleet.key)
    # Long streams running when the site dies: those on site a go on from site b (continue_final_message).
    streams: list[dict] = []

    def stream(n: int) -> None:
        got = {"chunks": 0, "finish": None, "error": None, "text": ""}
        streams.append(got)
        try:
            for ch in c.chat.completions.create(model="demo", messages=[{"role": "user", "content": f"story {n}"}],
                                                max_tokens=3000, stream=True):
                if ch.choices:
                    got["chunks"] += 1
                    got["text"] += ch.choices[0].delta.content or ""
                    got["finish"] = ch.choices[0].finish_reason or got["finish"]
        except Exception as exc:
            got["error"] = f"{type(exc).__name__}: {exc}"

    threads = []
    while inflight("testfleet-site-a") == 0 and len(threads) < CAPACITY:
        threads.append(threading.Thread(target=stream, args=(len(threads),)))
        threads[-1].start()
        time.sleep(0.3)
    on_a = inflight("testfleet-site-a")
    # the site goes dark (its link down: nothing answers, nothing refuses), then every process there dies
    fleet.site["a"].partition()
    assert fleet.site["a"].kill()
    lost = 0
    for i in range(20):
        try:
            c.chat.completions.create(model="demo", messages=[{"role": "user", "content": f"turn {i}"}], max_tokens=4)
        except Exception:
            lost += 1
    assert lost == 0
    deadline = time.monotonic() + 15  # a half-open probe into the dark site waits out its connect timeout (5 s)
    while time.monotonic() < deadline:
        seen = [h.get("deployments", {}).get("testfleet-site-a", {}).get("breaker") for h in replicas_health()]
        if seen == ["open", "open"]:
            break
        time.sleep(0.05)
    assert seen == ["open", "open"]
    for t in threads:
        t.join(timeout=120)
    assert on_a >= 1, "no stream was on site a when it died"
    assert [(s["error"], s["finish"] is not None) for s in streams] == [(None, True)] * len(streams), streams
    assert all(s["chunks"] > 1 for s in streams)

    fleet.site["a"].restore()
    back = cli("up", fleet.sites["a"])
    assert back.returncode == 0, back.stdout + back.stderr
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seen = [h.get("deployments", {}).get("testfleet-site-a", {}).get("breaker") for h in replicas_health()]
        if seen == ["closed", "closed"]:
            break
        time.sleep(0.2)
    assert seen == ["closed", "closed"], "the half-open probe did not close site a's breaker"


def test_overload_is_served_or_answered_429_and_admission_holds_capacity(fleet: Fleet) -> None:
    import openai

    results: list[str] = []
    peak = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            admitted = sum(d.get("inflight", 0) for h in replicas_health() for d in h.get("deployments", {}).values())
            peak[0] = max(peak[0], admitted)
            time.sleep(0.02)

    clients = [client(fleet.key) for _ in range(4 * CAPACITY)]  # built first: each one costs CPU to make
    start = threading.Barrier(4 * CAPACITY)  # all at once: spread out on a busy machine, early streams ended first

    def one(i: int) -> None:
        try:
            start.wait(timeout=60)
            stream = clients[i].chat.completions.create(
                model="demo", messages=[{"role": "user", "content": f"long {i}"}], max_tokens=3000, stream=True)
            finish = [ch.choices[0].finish_reason for ch in stream if ch.choices and ch.choices[0].finish_reason]
            results.append("served" if finish else "no finish_reason")
        except openai.RateLimitError as exc:
            retry = exc.response.headers.get("Retry-After")
            results.append("429" if retry else "429 without Retry-After")
        except Exception as exc:  # anything else is a lost request
            results.append(f"lost: {type(exc).__name__}: {exc}")

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(4 * CAPACITY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stop.set()
    watcher.join()
    assert set(results) <= {"429", "served"}, results
    assert "429" in results and "served" in results, results
    assert peak[0] <= 2 * CAPACITY + 2 * BLOCK, peak[0]


def new_key(fleet: Fleet, *args: str) -> str:
    made = cli("keys", "create", fleet.recipe, *args)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def admitted_everywhere() -> tuple[int, int]:
    """(requests in flight, slots granted) over both replicas and both sites."""
    docs = [d for h in replicas_health() for d in h.get("deployments", {}).values()]
    return sum(d["inflight"] for d in docs), sum(d["granted"] for d in docs)


def hold(key: str, tag: str, max_tokens: int = 250_000) -> socket.socket:
    """A long chat request (not streamed: nothing to read while it runs) on a socket of its own; closing the socket
    is the client going away. The mocker generates tokens at its own pace whatever the load, while a loaded
    machine slows the test's own steps: a hold asks for nearly the model's whole context so that it outlasts them
    (50,000 tokens once ended before a test had seen every slot taken)."""
    body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": tag}], "max_tokens": max_tokens})
    sock = socket.create_connection(("127.0.0.1", EDGE), timeout=10)
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: fleet\r\nAuthorization: Bearer {key}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode())
    return sock


def answered(sock: socket.socket, wait: float = 0.5) -> int | None:
    """The HTTP status the request on `sock` was answered with within `wait` seconds (None: still running)."""
    sock.settimeout(wait)
    try:
        head = sock.recv(64)
    except TimeoutError:
        return None
    return int(head.split()[1]) if head.startswith(b"HTTP/1.1 ") else -1


def wait_admitted(n: int, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while (got := admitted_everywhere()[0]) != n and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_a_queued_request_is_served_when_a_client_leaves_and_leaving_clients_leak_no_slot(fleet: Fleet) -> None:
    full = [hold(fleet.key, f"hold {i}") for i in range(2 * CAPACITY)]
    try:  # closed whatever happens: a hold left open would keep its slot from the tests after this one
        assert wait_admitted(2 * CAPACITY) == 2 * CAPACITY
        answer: list[object] = []
        waiter = threading.Thread(target=lambda: answer.append(client(fleet.key).chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "my turn?"}], max_tokens=2)))
        waiter.start()
        deadline = time.monotonic() + QUEUED
        while sum(sum(h.get("queued", {}).values()) for h in replicas_health()) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not answer, "a request was answered while every slot was taken"
        full.pop().close()  # one client goes away: its slot goes to the queued request
        waiter.join(timeout=QUEUED + 5)
        assert answer and answer[0].choices, "the queued request was not served when a slot freed"  # type: ignore[attr-defined]
    finally:
        for sock in full:
            sock.close()
    for i in range(40):  # streams their clients drop right after the first chunk
        stream = client(fleet.key).chat.completions.create(
            model="demo", messages=[{"role": "user", "content": f"cancel {i}"}], max_tokens=50_000, stream=True)
        next(iter(stream))
        stream.close()
    inflight_left = wait_admitted(0)
    assert inflight_left == 0, f"{inflight_left} slots still taken after every client left"
    assert admitted_everywhere()[1] <= 2 * 2 * BLOCK  # at most one idle spare block per replica and site


def test_a_team_limit_holds_across_both_replicas(fleet: Fleet) -> None:
    key = new_key(fleet, "--team", "capped")
    socks = [hold(key, f"capped {i}") for i in range(6)]
    try:
        time.sleep(1)
        statuses = [answered(sk, wait=0.2) for sk in socks]
        running = statuses.count(None)
        held = sum(h.get("limits", {}).get("team/capped", {}).get("inflight", 0) for h in replicas_health())
    finally:
        for sk in socks:
            sk.close()
    assert sorted(set(statuses), key=str) == [429, None], statuses
    assert running == 2 and held == 2, (statuses, held)


def test_a_team_tokens_per_minute_hold_across_both_replicas(fleet: Fleet) -> None:
    import openai

    if time.time() % 60 > 45:  # the budget is per minute: start the count at a minute's start
        time.sleep(60 - time.time() % 60)
    minute = int(time.time() // 60)
    c = client(new_key(fleet, "--team", "metered"))
    spent, most, refused = 0, 0, None
    for i in range(100):
        try:
            r = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": f"count {i}"}],
                                          max_tokens=20)
            assert r.usage
            spent += r.usage.prompt_tokens + r.usage.completion_tokens
            most = max(most, r.usage.prompt_tokens + r.usage.completion_tokens)
        except openai.RateLimitError as exc:
            refused = exc
            break
    assert int(time.time() // 60) == minute, "the minute ended during the test"
    assert refused is not None and refused.code == "tokens_per_minute", spent
    assert 0 < int(refused.response.headers["Retry-After"]) <= 60
    # every block is claimed by then; each replica admits while it has tokens left, so it spends at most one
    # request more than it claimed, and the other replica may have a block's tokens left unspent
    block = -(-TPM // 16)
    assert TPM - 2 * block <= spent <= TPM + 2 * most, (spent, most)


def test_answers_running_at_once_cannot_spend_past_a_keys_tokens_per_minute(fleet: Fleet) -> None:
    import openai

    if time.time() % 60 > 40:  # the budget is per minute: all of this within one
        time.sleep(60 - time.time() % 60)
    minute = int(time.time() // 60)
    c = client(new_key(fleet, "--team", "burst", "--tokens-per-minute", str(TPM)))
    spent: list[int] = []
    refused: list[str | None] = []

    def one(i: int) -> None:
        try:
            r = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": f"burst {i}"}],
                                          max_tokens=150)
            assert r.usage
            spent.append(r.usage.prompt_tokens + r.usage.completion_tokens)
        except openai.RateLimitError as exc:
            refused.append(exc.code)

    # four answers of up to 150 tokens at once: each is expected to take ~160, so only two fit in 400
    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert int(time.time() // 60) == minute, "the minute ended during the test"
    assert len(spent) + len(refused) == 4 and refused and set(refused) == {"tokens_per_minute"}, (spent, refused)
    # what was admitted fits the budget but for the prompts' estimate (4 characters a token; fewer here)
    assert sum(spent) <= TPM + 30 * len(spent), spent

    with pytest.raises(openai.RateLimitError) as whole:  # more than a whole minute's budget: refused outright
        c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "long"}], max_tokens=2 * TPM)
    assert "more than" in str(whole.value) and whole.value.code == "tokens_per_minute"


def test_a_batch_key_leaves_the_reserved_slots_to_interactive_traffic(fleet: Fleet) -> None:
    batch = new_key(fleet, "--team", "research", "--class", "batch")
    socks = [hold(batch, f"batch {i}") for i in range(2 * CAPACITY)]
    try:
        time.sleep(QUEUED + 1)  # the ones that queued have had their 429
        statuses = [answered(sk, wait=0.2) for sk in socks]
        reserve = -(-CAPACITY // 4 // BLOCK) * BLOCK  # batch_reserve 0.25 of each site
        running = statuses.count(None)
        assert set(statuses) <= {None, 429} and 0 < running <= 2 * (CAPACITY - reserve), statuses
        r = client(fleet.key).chat.completions.create(model="demo", messages=[{"role": "user", "content": "me first"}],
                                                      max_tokens=2)
        assert r.choices, "an interactive request found no slot while batch requests ran"
    finally:
        for sk in socks:
            sk.close()
    assert wait_admitted(0) == 0


def test_a_killed_replica_gives_its_capacity_back_within_its_lease(fleet: Fleet) -> None:
    import base64

    def held_by(replica: str) -> int:
        prefix = "/primectl/fleet/testfleet/admit/"
        body = json.dumps({"key": base64.b64encode(prefix.encode()).decode(),
                           "range_end": base64.b64encode(prefix[:-1].encode() + b"0").decode()}).encode()
        req = urllib.request.Request(f"{fleet.copy.etcd}/v3/kv/range", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=5) as resp:
            kvs = json.loads(resp.read()).get("kvs", [])
        return sum(1 for kv in kvs if base64.b64decode(kv["value"]).decode() == replica)

    c = client(fleet.key)
    for _ in range(4):  # each replica ends up holding blocks (HAProxy spreads the requests)
        c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    pid = replicas_health()[0]["pid"]
    assert held_by("gateway-0") >= 1
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    while held_by("gateway-0") and time.monotonic() - t0 < TTL + 5:
        time.sleep(0.1)
    assert held_by("gateway-0") == 0 and time.monotonic() - t0 <= TTL + 1.5
    r = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "still there?"}], max_tokens=2)
    assert r.choices  # the edge sends everything to the replica left


def test_usage_is_merged_by_team_and_no_key_is_written_anywhere(fleet: Fleet) -> None:
    up = cli("up", fleet.recipe)  # the killed replica comes back; its usage database survived
    assert up.returncode == 0, up.stdout + up.stderr
    assert up.stderr.count("no changes") >= 2, up.stderr  # both sites untouched; the gateway restarts gateway-0
    r = cli("usage", fleet.recipe, "--by", "team", "--since", "1h", "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(r.stdout)["rows"]
    research = next(row for row in rows if row["team"] == "research")
    assert research["requests"] >= 26 and research["prompt_tokens"] > 0 and research["completion_tokens"] > 0
    for args in (("plan", fleet.recipe, "-o", "json"), ("diff", fleet.recipe)):
        out = cli(*args)
        assert fleet.key not in out.stdout + out.stderr
    for w in fleet.workdirs:
        for p in w.rglob("*"):
            if p.is_file() and not p.is_symlink():
                assert fleet.key.encode() not in p.read_bytes(), p


def test_an_agent_sized_prompt_streams_through_the_edge_and_a_replica(fleet: Fleet) -> None:
    from primectl.checks.smoke import words

    prompt = words(115_000)  # 600 KB of JSON, ~460K tokens of the demo's tokenizer
    assert len(prompt) > 600_000
    stream = client(fleet.key).chat.completions.create(
        model="demo", messages=[{"role": "user", "content": prompt}], max_tokens=8, stream=True)
    finish = [ch.choices[0].finish_reason for ch in stream if ch.choices and ch.choices[0].finish_reason]
    assert finish, "the agent-sized stream ended without a finish_reason"


def test_a_weight_shift_then_down_of_the_old_site_loses_nothing(fleet: Fleet) -> None:
    outcomes: list[str] = []
    stop = threading.Event()

    def load() -> None:
        c = client(fleet.key)
        while not stop.is_set():
            try:
                stream = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "go on"}],
                                                   max_tokens=16, stream=True)
                done = any(ch.choices and ch.choices[0].finish_reason for ch in stream)
                outcomes.append("ok" if done else "no finish_reason")
            except Exception as exc:
                outcomes.append(f"lost: {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=load) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        doc = yaml.safe_load(fleet.recipe.read_text())
        doc["deployments"][0]["weight"] = 0
        fleet.recipe.write_text(yaml.safe_dump(doc, sort_keys=False))
        shifted = cli("up", fleet.recipe)
        assert shifted.returncode == 0, shifted.stdout + shifted.stderr
        assert shifted.stderr.count("no changes") == 2, shifted.stderr  # only the gateway changed
        gone = cli("down", fleet.sites["a"])
        assert gone.returncode == 0, gone.stdout + gone.stderr
        time.sleep(2)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=60)
    assert outcomes and all(o == "ok" for o in outcomes), ([o for o in outcomes if o != "ok"][:5], replicas_health())
