"""A fleet whose edge terminates TLS, for real (issue 39): one demo site behind two gateway replicas and HAProxy,
the edge given a certificate a throwaway CA signed (tests/certs.py).

- `up` passes the edge's readiness and the gate over TLS; `status -o json` names the https endpoint;
- the `openai` client that trusts the CA gets answers with a key (chat and a stream); one that does not trust it
  fails, and a plain-HTTP client to the same port gets no HTTP answer;
- the private key is on the gateway host only as the 0600 file HAProxy reads: in no log, no other file, no
  `plan`, `diff` or `status` output.

Run inside a loopback-only network namespace:

    unshare --net -- sh -c 'ip link set lo up && \\
        PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python .venv/bin/pytest tests/integration/test_fleet_tls.py -q'
"""

from __future__ import annotations

import http.client
import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from primectl.bench.fleet_copy import FleetCopy, write_fleet
from tests.certs import Pair, make_pair

from .fleetkit import cli, fleet_up

pytestmark = pytest.mark.integration

RUN = ("unshare --net -- sh -c 'ip link set lo up && PRIMECTL_RUNTIME_PYTHON=.runtime/bin/python "
       ".venv/bin/pytest tests/integration/test_fleet_tls.py -q'")
EDGE = 19_600


@dataclass
class TlsFleet:
    copy: FleetCopy
    pair: Pair
    key: str = ""




def client(fleet: TlsFleet, *, ca: Path | None):  # type: ignore[no-untyped-def]
    """The openai client trusting `ca` (None: the system's CAs only)."""
    import ssl

    import httpx2
    from openai import OpenAI

    return OpenAI(base_url=f"{fleet.copy.edge}/v1", api_key=fleet.key, max_retries=0, timeout=60,
                  http_client=httpx2.Client(verify=ssl.create_default_context(cafile=str(ca) if ca else None)))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsFleet]:
    root = tmp_path_factory.mktemp("tlsfleet")
    pair = make_pair(root / "certs")
    copy = write_fleet(root, port=EDGE, name="tlsfleet", capacity=8, only=("a",), tls=(pair.cert, pair.key))
    with fleet_up(copy, RUN):
        made = cli("keys", "create", copy.recipe, "--team", "tls")
        assert made.returncode == 0, made.stderr
        yield TlsFleet(copy, pair, made.stdout.strip())


def test_the_endpoint_is_https_and_answers_a_client_that_trusts_its_ca(fleet: TlsFleet) -> None:
    status = cli("status", fleet.copy.recipe, "-o", "json")
    assert status.returncode == 0, status.stdout + status.stderr
    assert json.loads(status.stdout)["endpoint"] == f"https://127.0.0.1:{EDGE}" == fleet.copy.edge

    c = client(fleet, ca=fleet.pair.ca)
    r = c.chat.completions.with_raw_response.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=8)
    assert r.http_response.status_code == 200 and r.parse().choices[0].message.content
    chunks = list(c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                            stream=True))
    assert chunks[-1].choices and chunks[-1].choices[0].finish_reason, chunks[-1]


def test_a_client_that_does_not_trust_it_or_speaks_plain_http_gets_nothing(fleet: TlsFleet) -> None:
    import openai

    with pytest.raises(openai.APIConnectionError) as untrusted:
        client(fleet, ca=None).models.list()
    assert "CERTIFICATE_VERIFY_FAILED" in repr(untrusted.value.__cause__) or "certificate" in repr(
        untrusted.value.__cause__).lower()
    with pytest.raises((OSError, http.client.HTTPException)):
        urllib.request.urlopen(f"http://127.0.0.1:{EDGE}/v1/models", timeout=5).read()


def test_the_private_key_is_only_in_the_file_haproxy_reads(fleet: TlsFleet) -> None:
    key = fleet.pair.key.read_bytes()
    line = key.decode().split("-----")[2].strip().splitlines()[0].encode()  # a line of its base64
    holding = [p for w in fleet.copy.workdirs.values() for p in w.rglob("*")
               if p.is_file() and not p.is_symlink() and line in p.read_bytes()]
    assert holding and all(p.name == "balancer-tls.pem.key" and p.stat().st_mode & 0o777 == 0o600
                           and p.read_bytes() == key for p in holding), holding
    for args in (("plan", fleet.copy.recipe, "-o", "json"), ("diff", fleet.copy.recipe),
                 ("status", fleet.copy.recipe, "-o", "json")):
        out = cli(*args)
        assert line.decode() not in out.stdout + out.stderr, args
    assert cli("diff", fleet.copy.recipe).returncode == 0  # nothing would change: the key's digest matches


def test_a_new_certificate_and_key_reach_the_edge_through_up(fleet: TlsFleet) -> None:
    import openai

    new = make_pair(fleet.pair.cert.parent.parent / "rotated")
    fleet.pair.cert.write_bytes(new.cert.read_bytes())
    fleet.pair.key.write_bytes(new.key.read_bytes())
    up = cli("up", fleet.copy.recipe)
    assert up.returncode == 0, up.stdout + up.stderr
    assert up.stderr.count("no changes") == 1, up.stderr  # the site is untouched; the gateway's edge changed
    r = client(fleet, ca=new.ca).chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}],
                                                         max_tokens=4)
    assert r.choices[0].message.content
    with pytest.raises(openai.APIConnectionError):
        client(fleet, ca=fleet.pair.ca).models.list()  # the old CA no longer vouches for the edge
    fleet.pair = new
