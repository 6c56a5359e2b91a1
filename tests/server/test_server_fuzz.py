"""Hypothesis against the real `pidesk serve` executable: frames over one WebSocket and over HTTP POST.

Every frame is answered exactly as JSON-RPC 2.0 and PROTOCOL.md say (the oracle below:
parse error, invalid request, method not found, invalid params, or a documented -32000
code — never INTERNAL, never an HTTP 500), nothing is answered for notifications, the
connection and the host stay up, and no state changes: after every example a batch of
host.hello + session.list + audit.list + host.status is compared with the first one, and
no event may arrive. State-changing methods are only ever sent with params that are
invalid before anything runs, so any change the host makes is a bug.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.sync.client import ClientConnection, connect

from pidesk.host.host import METHODS as HOST_METHODS

TOKEN = "fuzz-token-0123456789abcdef0123456789"
METHODS = set(HOST_METHODS)
READ_ONLY = sorted({"host.hello", "host.status", "session.list", "session.get", "session.turns", "agent.queue.list",
                    "permissions.pending", "plans.pending", "plans.list", "plans.get", "notifications.list",
                    "audit.list"})
MUTATING = sorted(METHODS - set(READ_ONLY))
SERVER_CODES = {"AGENT_BUSY", "NOT_FOUND", "TURN_ENDED", "STALE_REQUEST", "PLAN_NOT_FOUND", "PLAN_ALREADY_RESOLVED",
                "PLAN_APPROVAL_STALE", "PLAN_PERMISSION_MODE_REQUIRED", "PLAN_PERMISSION_MODE_INVALID",
                "PLAN_WORKSPACE_REQUIRED", "PLAN_REQUIRES_INTERACTIVE_SESSION", "PROTOCOL_MISMATCH",
                "PERSISTENCE_FAILURE"}  # PROTOCOL.md's -32000 table, minus LIMIT_EXCEEDED (-32600)
SETTINGS = settings(max_examples=250, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


@dataclass
class FuzzHost:
    url: str
    port: int
    session_id: str
    popen: subprocess.Popen[str]

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/rpc?token={TOKEN}"


@pytest.fixture(scope="module")
def fuzz_host(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "project").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIDESK_")} | {"XDG_CONFIG_HOME": str(root / "xdg")}
    popen = subprocess.Popen([sys.executable, "-m", "pidesk", "serve", "--data-dir", str(root / "data"), "--no-open",
                              "--port", "0", "--token", TOKEN], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert popen.stdout is not None
        line = popen.stdout.readline()
        assert line.startswith("pidesk serving at "), (line, popen.poll())
        url = line.split()[-1].split("/?")[0]
        created = httpx.post(url + "/rpc", json={"jsonrpc": "2.0", "id": 1, "method": "session.create",
                                                 "params": {"projectPath": str(root / "project")}},
                             headers={"Authorization": f"Bearer {TOKEN}"}, trust_env=False).json()
        yield FuzzHost(url, int(url.rsplit(":", 1)[1]), created["result"]["id"], popen)
        popen.send_signal(signal.SIGTERM)
        assert popen.wait(timeout=20) == 0  # the host survived every example and shuts down cleanly
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait()
        for stream in (popen.stdout, popen.stderr):
            if stream is not None:
                stream.close()


# ---- the oracle ----------------------------------------------------------------------------------


def valid_id(value: Any) -> bool:
    """What this host accepts as an id (PROTOCOL.md does not say; see the report): null, a string of
    at most 256 characters, or an integer exactly representable as a double."""
    return value is None or (isinstance(value, str) and len(value) <= 256) or (
        isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**53)


@dataclass(frozen=True)
class Expect:
    id: Any
    codes: frozenset[int]  # the JSON-RPC error codes allowed
    result_ok: bool = False  # a result is as good as an error (a read-only call)
    limit: bool = False


def expect_one(item: Any) -> Expect | None:
    if not isinstance(item, dict):
        return Expect(None, frozenset({-32600}))
    rid = item.get("id")
    if item.get("jsonrpc") != "2.0" or not isinstance(item.get("method"), str) or not valid_id(rid):
        return Expect(rid if valid_id(rid) else None, frozenset({-32600}))
    if "id" not in item:
        return None
    method, params = item["method"], item.get("params")
    if method not in METHODS:
        return Expect(rid, frozenset({-32601}))
    if params is not None and not isinstance(params, dict):
        return Expect(rid, frozenset({-32602}))
    if method in MUTATING:
        return Expect(rid, frozenset({-32602}))  # only ever sent with an unknown param
    return Expect(rid, frozenset({-32602, -32000}), result_ok=True)


def expect(message: Any) -> list[Expect] | Expect | None:
    if isinstance(message, list):
        if not message:
            return Expect(None, frozenset({-32600}))
        if len(message) > 1000:
            return Expect(None, frozenset({-32600}), limit=True)
        answers = [e for e in (expect_one(item) for item in message) if e is not None]
        return answers or None
    return expect_one(message)


def check_error(error: Any, codes: frozenset[int]) -> None:
    assert isinstance(error, dict) and set(error) <= {"code", "message", "data"}, error
    assert isinstance(error["message"], str) and error["code"] in codes, (error, codes)
    data_code = (error.get("data") or {}).get("code")
    wanted = {-32601: {"METHOD_NOT_FOUND"}, -32602: {"INVALID_PARAMS"}, -32000: SERVER_CODES,
              -32700: {None}, -32600: {None, "LIMIT_EXCEEDED"}}[error["code"]]
    assert data_code in wanted, error


def check_answer(answer: Any, want: Expect) -> None:
    assert isinstance(answer, dict) and answer.get("jsonrpc") == "2.0", answer
    assert "id" in answer and answer["id"] == want.id and type(answer["id"]) is type(want.id), (answer, want)
    if "result" in answer:
        assert want.result_ok and set(answer) == {"jsonrpc", "id", "result"}, (answer, want)
        return
    assert set(answer) == {"jsonrpc", "id", "error"}, answer
    check_error(answer["error"], want.codes)
    if want.limit:
        assert answer["error"]["data"]["code"] == "LIMIT_EXCEEDED"


def check_payload(payload: Any, want: list[Expect] | Expect | None) -> None:
    """``payload`` is what came back (None: nothing)."""
    if want is None:
        assert payload is None, payload
    elif isinstance(want, list):
        assert isinstance(payload, list) and len(payload) == len(want), (payload, want)
        for answer, one in zip(payload, want, strict=True):
            check_answer(answer, one)
    else:
        check_answer(payload, want)


# ---- strategies ------------------------------------------------------------------------------------

S0 = "$S0"  # replaced by the real pre-made session id before sending
scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
ids = (st.none() | st.integers(-(2**60), 2**60) | st.text(max_size=300) | st.floats(allow_nan=False, allow_infinity=False)
       | st.booleans() | st.lists(st.integers(), max_size=2) | st.sampled_from([2**53 - 1, 2**53, -(2**53), 2**64, 10**30])
       | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def nested(depth: int, leaf: Any, kind: str) -> Any:
    for _ in range(depth):
        leaf = [leaf] if kind == "list" else {"k": leaf}
    return leaf


deep = st.builds(nested, st.integers(1, 300), scalars, st.sampled_from(["list", "dict"]))
# Numbers for integer params: in and around every range a param allows, SQLite's int64 edges, far past
# them, and what Python confuses with integers (bools, integral floats).
INT_EDGES = [0, 1, -1, 1000, 1001, 10_000, 10_001, 2**53, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 2**70,
             -(2**70), True, False, 1.0, 0.0, -1.5, 1e300]
numbers = (st.integers(-(2**70), 2**70) | st.integers(-5, 10_010) | st.sampled_from(INT_EDGES) | st.booleans()
           | st.floats(allow_nan=False, allow_infinity=False))
READ_PARAMS = {"sessionId": st.sampled_from([S0, "s_nope"]) | json_values, "limit": numbers | json_values,
               "beforeSeq": numbers | json_values, "protocolVersion": st.just(1) | numbers | json_values,
               "client": json_values,
               "projectPath": st.text(max_size=30).filter(lambda t: "\x00" not in t) | json_values,
               "approvalId": json_values, "unseenOnly": json_values, "extra": deep}
read_params = st.none() | json_values | deep | st.fixed_dictionaries({}, optional=READ_PARAMS)
bad_params = (st.lists(json_values, max_size=3) | scalars.filter(lambda v: v is not None) | deep
              | st.dictionaries(st.text(max_size=8), json_values, max_size=3).map(lambda d: {**d, "zzUnknown": 1}))


good_ids = st.integers(-(2**53 - 1), 2**53 - 1) | st.text(max_size=40) | st.none()


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly well-formed requests (so the methods themselves get fuzzed), the rest malformed anywhere."""
    well_formed = draw(st.integers(0, 9)) < 7
    kind = draw(st.sampled_from(["read", "read", "mutating", "random"]))
    if kind == "read":
        method, params = draw(st.sampled_from(READ_ONLY)), draw(read_params)
    elif kind == "mutating":
        method, params = draw(st.sampled_from(MUTATING)), draw(bad_params)
    else:
        method = draw(st.text(max_size=30).filter(lambda m: m not in METHODS)
                      | (st.nothing() if well_formed else json_values))
        params = draw(json_values | deep)
    frame: dict[str, Any] = {}
    if well_formed:
        frame["jsonrpc"] = "2.0"
        frame["method"] = method
        if draw(st.integers(0, 9)):
            frame["id"] = draw(good_ids)
    else:
        if draw(st.integers(0, 9)):
            frame["jsonrpc"] = draw(st.just("2.0") if draw(st.booleans()) else json_values)
        if draw(st.integers(0, 9)):
            frame["method"] = method
        if draw(st.integers(0, 4)):
            frame["id"] = draw(ids)
    if params is not None or draw(st.booleans()):
        frame["params"] = params
    return frame


frames = (requests() | requests() | st.lists(requests(), max_size=25) | json_values | deep
          | st.lists(requests(), min_size=1, max_size=3).map(lambda b: b + [{"jsonrpc": "2.0", "method": "host.status"}]))
garbage = (st.binary(max_size=64) | st.text(max_size=64).map(str.encode)
           | st.tuples(requests(), st.integers(0, 200)).map(lambda t: json.dumps(t[0]).encode()[: t[1]]))


def substitute(value: Any, session_id: str) -> Any:
    if value == S0:
        return session_id
    if isinstance(value, list):
        return [substitute(v, session_id) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, session_id) for k, v in value.items()}
    return value


def oracle_for_bytes(raw: bytes) -> list[Expect] | Expect | None | str:
    """The expectation for arbitrary bytes; "any-error" when strict JSON parsers may disagree."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return Expect(None, frozenset({-32700}))
    try:
        message = json.loads(text, parse_constant=_reject, parse_float=_finite)
    except _Ambiguous:
        return "any-error"
    except ValueError:
        return Expect(None, frozenset({-32700}))
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in json.dumps(message, ensure_ascii=False)):
        return "any-error"  # a lone surrogate: JSON allows it, parsers differ (msgspec refuses it)
    return expect(message)


class _Ambiguous(Exception):
    pass


def _reject(name: str) -> Any:
    raise ValueError(name)  # NaN / Infinity are not JSON


def _finite(literal: str) -> float:
    value = float(literal)
    if value in (float("inf"), float("-inf")):
        raise _Ambiguous(literal)  # valid JSON, out of a double's range: an error either way
    return value


# ---- the marker: proof the host is up and nothing changed ------------------------------------------

MARKER = [{"jsonrpc": "2.0", "id": "m-hello", "method": "host.hello", "params": {"protocolVersion": 1}},
          {"jsonrpc": "2.0", "id": "m-status", "method": "host.status"},
          {"jsonrpc": "2.0", "id": "m-sessions", "method": "session.list"},
          {"jsonrpc": "2.0", "id": "m-audit", "method": "audit.list", "params": {"limit": 10000}}]


def state_of(marker_answer: Any) -> list[Any]:
    assert [a["id"] for a in marker_answer] == ["m-hello", "m-status", "m-sessions", "m-audit"], marker_answer
    assert marker_answer[0]["result"]["protocolVersion"] == 1
    return [a["result"] for a in marker_answer[1:]]


class WsProbe:
    def __init__(self, host: FuzzHost, ws: ClientConnection) -> None:
        self.host = host
        self.ws = ws
        self.baseline = self.marker_state([])

    def marker_state(self, replies: list[Any]) -> list[Any]:
        """Send the marker batch; collect replies until its answer. Any event fails the test."""
        self.ws.send(json.dumps(MARKER))
        while True:
            message = json.loads(self.ws.recv(timeout=10))
            assert not (isinstance(message, dict) and message.get("method") == "event"), f"state changed: {message}"
            if isinstance(message, list) and message and isinstance(message[0], dict) and message[0].get("id") == "m-hello":
                return state_of(message)
            replies.append(message)

    def exchange(self, frame: str | bytes) -> list[Any]:
        self.ws.send(frame)
        replies: list[Any] = []
        assert self.marker_state(replies) == self.baseline
        return replies


@pytest.fixture(scope="module")
def ws_probe(fuzz_host: FuzzHost) -> Any:
    with connect(fuzz_host.ws_url, proxy=None, max_size=None, compression=None) as ws:
        yield WsProbe(fuzz_host, ws)


def one_reply(replies: list[Any]) -> Any:
    assert len(replies) <= 1, replies
    return replies[0] if replies else None


@SETTINGS
@given(frame=frames)
def test_websocket_frames_get_the_right_answer_and_change_nothing(ws_probe, fuzz_host, frame):
    frame = substitute(frame, fuzz_host.session_id)
    check_payload(one_reply(ws_probe.exchange(json.dumps(frame))), expect(frame))


@settings(SETTINGS, max_examples=150)
@given(raw=garbage)
def test_websocket_garbage_gets_an_error_and_changes_nothing(ws_probe, raw):
    want = oracle_for_bytes(raw)
    reply = one_reply(ws_probe.exchange(raw))  # binary frames, as bytes
    if want == "any-error":
        assert reply is not None and ("error" in reply or isinstance(reply, list)), reply
    else:
        check_payload(reply, want)


class HttpProbe:
    def __init__(self, host: FuzzHost) -> None:
        self.host = host
        self.client = httpx.Client(trust_env=False, timeout=10, limits=httpx.Limits(max_keepalive_connections=0),
                                   headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        self.baseline = self.state()

    def state(self) -> list[Any]:
        return state_of(self.client.post(self.host.url + "/rpc", content=json.dumps(MARKER)).json())

    def post(self, body: bytes) -> Any:
        response = self.client.post(self.host.url + "/rpc", content=body)
        assert response.status_code in (200, 204), (response.status_code, response.text[:500])
        payload = None if response.status_code == 204 else response.json()
        if response.status_code == 204:
            assert response.content == b""
        assert self.state() == self.baseline
        return payload


@pytest.fixture(scope="module")
def http_probe(fuzz_host: FuzzHost) -> Any:
    probe = HttpProbe(fuzz_host)
    yield probe
    probe.client.close()


@settings(SETTINGS, max_examples=150)
@given(frame=frames)
def test_http_posts_get_the_right_answer_and_change_nothing(http_probe, fuzz_host, frame):
    frame = substitute(frame, fuzz_host.session_id)
    check_payload(http_probe.post(json.dumps(frame).encode()), expect(frame))


@settings(SETTINGS, max_examples=100)
@given(raw=garbage)
def test_http_garbage_gets_an_error_and_changes_nothing(http_probe, raw):
    want = oracle_for_bytes(raw)
    payload = http_probe.post(raw)
    if want == "any-error":
        assert payload is not None
    else:
        check_payload(payload, want)


# ---- integer params: every number, every range -----------------------------------------------------------

# (method, param) -> the range it allows; every integer param of PROTOCOL.md's table (attachment sizes,
# the one other, are in test_server_door_limits.py: sending them can queue a prompt)
INT_RANGES = {("session.get", "beforeSeq"): (0, 2**63 - 1), ("session.get", "limit"): (1, 1000),
              ("session.turns", "limit"): (1, 1000), ("audit.list", "limit"): (1, 10_000)}


def is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@settings(SETTINGS, max_examples=300)
@given(target=st.sampled_from([*INT_RANGES, ("host.hello", "protocolVersion")]), value=numbers)
def test_integer_params_out_of_range_are_invalid_params_never_internal(http_probe, fuzz_host, target, value):
    """Authority hole 14 (and 16): any number in any integer param — up to ±2^70, bools, floats — is
    answered: a result when it is an integer in the param's range, else INVALID_PARAMS naming the range
    (host.hello: PROTOCOL_MISMATCH for another integer). Never INTERNAL, nothing changes."""
    method, name = target
    params: dict[str, Any] = {name: value}
    if method in ("session.get", "session.turns"):
        params["sessionId"] = fuzz_host.session_id
    answer = http_probe.post(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode())
    if method == "host.hello":
        if is_integer(value) and value == 1:
            assert answer["result"]["protocolVersion"] == 1, answer
        elif is_integer(value):
            assert answer["error"]["data"]["code"] == "PROTOCOL_MISMATCH", answer
        else:
            assert answer["error"]["code"] == -32602 and answer["error"]["data"]["code"] == "INVALID_PARAMS", answer
        return
    low, high = INT_RANGES[target]
    if is_integer(value) and low <= value <= high:
        assert "result" in answer, answer
    else:
        assert answer["error"]["code"] == -32602 and answer["error"]["data"]["code"] == "INVALID_PARAMS", answer
        assert f"{name} must be an integer from {low} to {high}" in answer["error"]["message"], answer


# ---- the big and the deep, deterministically ----------------------------------------------------------


def test_big_batches(ws_probe, http_probe):
    hellos = [{"jsonrpc": "2.0", "id": i, "method": "host.hello", "params": {"protocolVersion": 1}} for i in range(1000)]
    answers = one_reply(ws_probe.exchange(json.dumps(hellos)))
    assert [a["id"] for a in answers] == list(range(1000)) and all("result" in a for a in answers)
    creates = [{"jsonrpc": "2.0", "id": i, "method": "session.create"} for i in range(1001)]
    for payload in (one_reply(ws_probe.exchange(json.dumps(creates))), http_probe.post(json.dumps(creates).encode())):
        check_payload(payload, Expect(None, frozenset({-32600}), limit=True))  # and nothing was created
    junk = [[i] for i in range(1000)]
    assert len(one_reply(ws_probe.exchange(json.dumps(junk)))) == 1000
    notes = [{"jsonrpc": "2.0", "method": "host.status"}] * 1000
    assert ws_probe.exchange(json.dumps(notes)) == []
    assert http_probe.post(json.dumps(notes).encode()) is None


def test_huge_ids_are_invalid_requests_with_a_null_id(ws_probe):
    for rid in (2**53, -(2**53), 2**64, 10**100, 1.5, "x" * 257):
        frame = {"jsonrpc": "2.0", "id": rid, "method": "host.status"}
        check_payload(one_reply(ws_probe.exchange(json.dumps(frame))), Expect(None, frozenset({-32600})))
    for rid in (2**53 - 1, -(2**53 - 1), "x" * 256, 0, "", None):
        reply = one_reply(ws_probe.exchange(json.dumps({"jsonrpc": "2.0", "id": rid, "method": "host.status"})))
        assert reply["id"] == rid and "result" in reply


def deep_frame(depth: int) -> str:
    return ('{"jsonrpc":"2.0","id":7,"method":"host.status","params":{"x":' + "[" * depth + "]" * depth + "}}")


def test_moderate_nesting_is_answered(ws_probe, http_probe):
    for depth in (100, 500):
        check_payload(one_reply(ws_probe.exchange(deep_frame(depth))), Expect(7, frozenset({-32602})))
        check_payload(http_probe.post(deep_frame(depth).encode()), Expect(7, frozenset({-32602})))


def test_very_deep_nesting_leaves_the_host_up_and_unchanged(ws_probe, fuzz_host):
    """10k levels: whatever the answer, the connection and the host survive and nothing changes."""
    for frame in (deep_frame(10_000), "[" * 10_000 + "]" * 10_000, '{"a":' * 10_000 + "1" + "}" * 10_000):
        ws_probe.exchange(frame)  # the marker after it proves the connection is up and the state unchanged
    response = httpx.post(fuzz_host.url + "/rpc", content=deep_frame(10_000), trust_env=False,
                          headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code in (200, 500)
    assert ws_probe.marker_state([]) == ws_probe.baseline


@pytest.mark.parametrize("transport", ["websocket", "http"])
def test_very_deep_nesting_gets_a_json_rpc_error(ws_probe, http_probe, transport):
    frame = deep_frame(10_000)
    payload = one_reply(ws_probe.exchange(frame)) if transport == "websocket" else http_probe.post(frame.encode())
    assert payload is not None and payload["error"]["code"] in (-32700, -32600), payload
