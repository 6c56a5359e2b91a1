"""The door, as an attacker meets it: every refused request is refused BEFORE any method runs.

Each refused request is a ``session.create`` (a visible side effect); afterwards a
properly authenticated ``session.list`` and ``audit.list`` must be unchanged. One
server serves the whole module (``shared_served``). Door order (PROTOCOL.md):
Host (403), then Origin (403), then token (401).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

pytestmark = pytest.mark.asyncio(loop_scope="module")

CREATE = {"jsonrpc": "2.0", "id": 1, "method": "session.create", "params": {"title": "attacker"}}
GOOD = "GOOD"  # stands for the real token in the tables below


@pytest.fixture
def served(shared_served):
    return shared_served


def _headers(spec: dict[str, str], served: Any) -> dict[str, str]:
    """Fill the placeholders: GOOD -> the token, PORT -> the port, OTHER -> another port."""
    other = served.port + 1 if served.port < 65535 else served.port - 1
    return {k: v.replace(GOOD, served.token).replace("PORT", str(served.port)).replace("OTHER", str(other))
            for k, v in spec.items()}


REFUSED_HTTP = [
    # name, headers, query, status, message fragment
    ("no token", {}, "", 401, "token"),
    ("wrong token", {"Authorization": "Bearer wrong-token"}, "", 401, "token"),
    ("token prefix", {"Authorization": "Bearer " + GOOD + "x"}, "", 401, "token"),
    ("scheme without token", {"Authorization": "Bearer"}, "", 401, "token"),
    ("lower-case scheme, wrong token", {"Authorization": "bearer " + GOOD + "0"}, "", 401, "token"),
    ("bare token, no scheme", {"Authorization": GOOD}, "", 401, "token"),
    ("?token= on HTTP POST", {}, "?token=" + GOOD, 401, "token"),
    ("Authorization: Basic", {"Authorization": "Basic " + base64.b64encode(b"pidesk:" + GOOD.encode()).decode()},
     "", 401, "token"),
    ("token in a cookie", {"Cookie": "token=" + GOOD}, "", 401, "token"),
    ("token in a pidesk cookie", {"Cookie": "pidesk_token=" + GOOD + "; session=" + GOOD}, "", 401, "token"),
    ("foreign Origin", {"Authorization": "Bearer " + GOOD, "Origin": "http://evil.example"}, "", 403, "origin"),
    ("Origin: null", {"Authorization": "Bearer " + GOOD, "Origin": "null"}, "", 403, "origin"),
    ("own host, other port Origin", {"Authorization": "Bearer " + GOOD, "Origin": "http://127.0.0.1:OTHER"},
     "", 403, "origin"),
    ("https Origin", {"Authorization": "Bearer " + GOOD, "Origin": "https://127.0.0.1:PORT"}, "", 403, "origin"),
    ("rebinding Host", {"Authorization": "Bearer " + GOOD, "Host": "evil.example:PORT"}, "", 403, "Host"),
    ("loopback Host, other port", {"Authorization": "Bearer " + GOOD, "Host": "127.0.0.1:OTHER"}, "", 403, "Host"),
    ("Host without port", {"Authorization": "Bearer " + GOOD, "Host": "127.0.0.1"}, "", 403, "Host"),
    ("Host 0.0.0.0", {"Authorization": "Bearer " + GOOD, "Host": "0.0.0.0:PORT"}, "", 403, "Host"),
    # door order: Host before Origin before token
    ("rebinding Host, no token", {"Host": "evil.example:PORT", "Origin": "http://evil.example"}, "", 403, "Host"),
    ("foreign Origin, no token", {"Origin": "http://evil.example"}, "", 403, "origin"),
]


@pytest.mark.parametrize("name, spec, query, status, fragment", REFUSED_HTTP, ids=[r[0] for r in REFUSED_HTTP])
async def test_a_refused_http_request_runs_nothing(served, name, spec, query, status, fragment):
    before = await served.snapshot()
    response = await served.post(CREATE, _headers(spec, served) | {"Content-Type": "application/json"},
                                 authed=False, path="/rpc" + query.replace(GOOD, served.token))
    assert response.status_code == status, (name, response.status_code, response.text)
    assert fragment.lower() in response.text.lower()
    assert served.token not in response.text
    assert await served.snapshot() == before


ACCEPTED_HTTP = [
    ("Bearer header", {"Authorization": "Bearer " + GOOD}),
    ("localhost Host", {"Authorization": "Bearer " + GOOD, "Host": "localhost:PORT"}),
    ("[::1] Host", {"Authorization": "Bearer " + GOOD, "Host": "[::1]:PORT"}),
    ("own Origin", {"Authorization": "Bearer " + GOOD, "Origin": "http://127.0.0.1:PORT"}),
    ("own localhost Origin", {"Authorization": "Bearer " + GOOD, "Origin": "http://localhost:PORT"}),
]


@pytest.mark.parametrize("name, spec", ACCEPTED_HTTP, ids=[a[0] for a in ACCEPTED_HTTP])
async def test_the_right_credentials_are_accepted(served, name, spec):
    count = len((await served.call("session.list"))["sessions"])
    response = await served.post(CREATE, _headers(spec, served) | {"Content-Type": "application/json"}, authed=False)
    assert response.status_code == 200, response.text
    assert response.json()["result"]["title"] == "attacker"
    assert len((await served.call("session.list"))["sessions"]) == count + 1


async def _ws_status(url: str, **kwargs: Any) -> int:
    try:
        ws = await connect(url, proxy=None, open_timeout=5, **kwargs)
    except InvalidStatus as refused:
        return refused.response.status_code
    await ws.close()
    return 101


REFUSED_WS = [
    ("no token", "", {}, {}, 401),
    ("wrong ?token=", "?token=wrong", {}, {}, 401),
    ("two ?token=", "?token=" + GOOD + "&token=" + GOOD, {}, {}, 401),
    ("wrong bearer", "", {"Authorization": "Bearer nope"}, {}, 401),
    ("token in a cookie", "", {"Cookie": "token=" + GOOD}, {}, 401),
    ("Basic auth", "", {"Authorization": "Basic " + base64.b64encode(GOOD.encode()).decode()}, {}, 401),
    ("foreign Origin", "?token=" + GOOD, {}, {"origin": "http://evil.example"}, 403),
    ("Origin: null", "?token=" + GOOD, {}, {"origin": "null"}, 403),
    ("foreign Origin with bearer", "", {"Authorization": "Bearer " + GOOD}, {"origin": "http://evil.example"}, 403),
]


@pytest.mark.parametrize("name, query, spec, extra, status", REFUSED_WS, ids=[r[0] for r in REFUSED_WS])
async def test_a_refused_websocket_gets_no_upgrade(served, name, query, spec, extra, status):
    before, closed = await served.snapshot(), len(served.host.closed_clients)
    url = served.ws_url + query.replace(GOOD, served.token)
    assert await _ws_status(url, additional_headers=_headers(spec, served), **extra) == status
    assert len(served.host.closed_clients) == closed  # no connection ever reached the RPC handler
    assert await served.snapshot() == before


@pytest.mark.parametrize("host", ["evil.example", "attacker.localhost"])
async def test_a_websocket_with_a_rebinding_host_is_refused(served, host):
    closed = len(served.host.closed_clients)
    url = f"ws://{host}:{served.port}/rpc?token={served.token}"
    assert await _ws_status(url, host="127.0.0.1", port=served.port) == 403  # connect to us, say Host: evil
    assert await _ws_status(served.ws_url + f"?token={served.token}",
                            additional_headers={"Host": f"127.0.0.1:{served.port + 1}"}) in (400, 403)
    assert len(served.host.closed_clients) == closed


async def test_the_token_works_in_the_header_and_in_the_websocket_query(served):
    by_header = await served.ws()
    by_query = await served.ws(query_token=True)
    own_origin = await served.ws(origin=f"http://127.0.0.1:{served.port}")
    for client in (by_header, by_query, own_origin):
        assert (await client.call("host.hello", {"protocolVersion": 1}))["protocolVersion"] == 1
    made = await by_query.call("session.create", {"title": "seen by the other"})
    assert (await by_header.event("session.updated", lambda e: e["session"]["id"] == made["id"]))["session"]["title"] \
        == "seen by the other"


async def test_healthz_needs_no_token_but_checks_host_and_origin(served):
    get = served.http.get
    ok = await get(served.url + "/healthz")
    assert (ok.status_code, ok.json()) == (200, {"ok": True})
    assert (await get(served.url + "/healthz", headers={"Host": f"evil.example:{served.port}"})).status_code == 403
    assert (await get(served.url + "/healthz", headers={"Origin": "http://evil.example"})).status_code == 403
    assert (await get(served.url + "/healthz", headers={"Authorization": "Bearer wrong"})).status_code == 200
    # the static UI likewise: no token, but the Host check applies
    assert (await get(served.url + "/")).status_code == 200
    assert (await get(served.url + "/", headers={"Host": f"evil.example:{served.port}"})).status_code == 403


async def test_only_the_rpc_endpoint_itself_needs_the_token():
    from pidesk.server.door import Door

    door = Door(app=None, token="t", port=lambda: 8000)
    headers = {"host": "127.0.0.1:8000"}
    assert door.check({"type": "http", "path": "/rpc.js"}, headers) is None
    assert door.check({"type": "http", "path": "/rpc"}, headers) == (401, "unauthorized: a valid token is required")
