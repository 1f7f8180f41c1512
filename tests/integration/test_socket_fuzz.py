"""Hypothesis against the runner socket of a live coordinator (uvicorn on a free port), on
SQLite and PostgreSQL: an Init with arbitrary fields, then an arbitrary sequence of frames
(valid messages with arbitrary values, garbage, binary frames, a second Init, events for
runs that are and are not the runner's). Whatever a peer sends:

* the coordinator answers the Init or closes the socket — it never leaves one hanging;
* once the peer hangs up, no socket is left open on the coordinator (``Connections.open``);
* every REST read still answers 200 (nothing stored breaks a listing), and it answers at
  once (the coordinator stays responsive).

Requests and upgrades carry ``api_fixtures.auth_headers()``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
from api_fixtures import SERVER_BESIDE_HYPOTHESIS, auth_headers, live_server, with_token
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from test_socket_frames import _init_frame
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from corral.coordinator.app import create_app
from corral.coordinator.service import Coordinator
from corral.coordinator.settings import CoordinatorSettings
from corral.protocol import messages as m

pytestmark = SERVER_BESIDE_HYPOTHESIS

EXAMPLES = 40  # for each database: CI's run stays in seconds
STEP_S = 10.0  # the bound on any one answer (a correctness bound, not a benchmark)
READS = ("/health", "/runs", "/runners", "/stats", "/projects")

# ---- values: mostly plausible, sometimes anything JSON can carry --------------------------

HUGE = st.sampled_from([2**31, 2**63, 2**64, -(2**63) - 1, 10**30])
INTS = st.one_of(st.integers(-5, 5), st.integers(), HUGE)
NASTY_TEXT = st.sampled_from(["", "\x00", "\ud800", "a\nb", "x" * 70_000, "é🐍", "../../x"])
TEXT = st.one_of(st.text(max_size=20), NASTY_TEXT)
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 10))
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXT)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)


EDGES = st.one_of(
    st.sampled_from(
        [0, -1, 2**31, 2**63, 2**64, -(2**63) - 1, 1.5, "", "\x00", "\ud800", "a\nb", None, [], {}]
    ),
    st.just("x" * 70_000),
    JSON,
)


def maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A valid value most of the time, else an edge case or any JSON value."""
    return st.one_of(valid, valid, valid, EDGES)


def rarely(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A valid value but once in ten times: a frame of many fields is then often valid."""
    return st.one_of(*[valid] * 9, EDGES)


def init_frame(**changes: Any) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(_init_frame(**{"name": "fuzz", **changes}))
    return frame


# An Init as a runner sends it (two times in three), or with one or two of its fields (or an
# extra one) set to anything.
INIT_FIELDS = st.builds(
    lambda changes: init_frame(**changes),
    st.one_of(
        st.just({}),
        st.just({}),
        st.dictionaries(
            st.sampled_from([*init_frame(), "extra"]).filter(lambda k: k != "type"),
            EDGES,
            min_size=1,
            max_size=2,
        ),
    ),
)

RUN_IDS = st.one_of(st.just("{run}"), st.just("{run}"), st.just("run_000000000000"), TEXT)


def event_body() -> st.SearchStrategy[dict[str, Any]]:
    line = st.fixed_dictionaries(
        {
            "line_no": rarely(st.integers(0, 100)),
            "stream": rarely(st.sampled_from(["stdout", "stderr"])),
            "text": rarely(st.text(max_size=30)),
            "ts": rarely(st.floats(0, 2e9)),
        }
    )
    common = {"run_id": RUN_IDS, "attempt": rarely(st.integers(1, 2))}
    return st.one_of(
        st.fixed_dictionaries({"type": st.just("started"), **common}),
        st.fixed_dictionaries(
            {"type": st.just("logs"), **common, "lines": rarely(st.lists(line, max_size=3))}
        ),
        st.fixed_dictionaries(
            {
                "type": st.just("finished"),
                **common,
                "status": rarely(st.sampled_from(["completed", "failed", "pending"])),
                "exit_code": rarely(st.integers(0, 2)),
                "error": rarely(st.none()),
                "usage": rarely(st.none()),
            }
        ),
        st.fixed_dictionaries(
            {"type": st.just("session"), **common, "session_id": rarely(st.text(max_size=10))}
        ),
        st.dictionaries(TEXT, JSON, max_size=4),
    )


def frame() -> st.SearchStrategy[str | bytes]:
    def message(kind: str, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[str | bytes]:
        body = st.fixed_dictionaries({"v": st.just(m.PROTOCOL_VERSION), **fields})
        return body.map(lambda b: json.dumps({"type": kind, **b}))

    indexed = st.fixed_dictionaries({"idx": rarely(st.integers(1, 6)), "body": event_body()})
    valid = st.one_of(
        message("ToServerPing", ts=rarely(st.floats(0, 2e9))),
        message("ToServerAckCommands", last_command_idx=rarely(st.integers(0, 5))),
        message("ToServerEvents", events=rarely(st.lists(indexed, min_size=1, max_size=4))),
        message("ToServerStopping"),
        message(
            "ToServerKvRequest",
            request_id=rarely(st.integers(1, 5)),
            actor_id=rarely(st.text(max_size=10)),
            op=rarely(st.fixed_dictionaries({"op": st.sampled_from(["get", "put", "list"])})),
        ),
    )
    garbage = st.one_of(
        INIT_FIELDS.map(json.dumps),  # a second Init
        st.dictionaries(TEXT, JSON, max_size=4).map(json.dumps),
        st.text(max_size=50),
        st.binary(max_size=50),
    )
    # Mostly messages (with odd values): garbage ends the conversation at once.
    return st.one_of(valid, valid, valid, valid, garbage)


def plausible_events() -> str:
    line = {"line_no": 0, "stream": "stdout", "text": "hi", "ts": 1.0}
    bodies = [
        {"type": "started", "run_id": "{run}", "attempt": 1},
        {"type": "logs", "run_id": "{run}", "attempt": 1, "lines": [line]},
        {"type": "finished", "run_id": "{run}", "attempt": 1, "status": "completed"},
    ]
    events = [{"idx": i, "body": body} for i, body in enumerate(bodies, 1)]
    return json.dumps({"v": m.PROTOCOL_VERSION, "type": "ToServerEvents", "events": events})


# ---- the coordinator, and a peer ----------------------------------------------------------


@contextlib.contextmanager
def served(db_url: str) -> Iterator[tuple[Coordinator, httpx.Client, str]]:
    app = create_app(
        with_token(CoordinatorSettings(db_url=db_url, poll_timeout_s=1.0, ws_ping_interval_s=0.5)),
        reconcile=False,
    )
    with (
        live_server(app, ws="websockets-sansio", graceful_shutdown_s=2) as url,
        httpx.Client(base_url=url, timeout=STEP_S, headers=auth_headers()) as http,
    ):
        yield app.state.coordinator, http, "ws://" + url.removeprefix("http://")


def receive_all(ws: ClientConnection) -> list[str | bytes]:
    """Frames until the coordinator has nothing more to say for a moment, or closes."""
    frames: list[str | bytes] = []
    with contextlib.suppress(ConnectionClosed, TimeoutError):
        while True:
            frames.append(ws.recv(timeout=0.2))
    return frames


def answered_or_closed(ws: ClientConnection) -> bool:
    """The Init's fate: a ToClientInit, or the socket closed by the coordinator."""
    deadline = time.monotonic() + STEP_S
    while time.monotonic() < deadline:
        try:
            frame = ws.recv(timeout=max(0.0, deadline - time.monotonic()))
        except ConnectionClosed:
            return True
        except TimeoutError:
            return False
        if isinstance(frame, str) and '"ToClientInit"' in frame:
            return True
    return False


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + STEP_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_whatever_a_peer_sends_the_coordinator_holds(db_url: str) -> None:
    with served(db_url) as (coordinator, http, ws_url):
        created = http.post("/runs", json={"type": "command", "command": ["true"]})
        assert created.status_code == 201, created.text
        run_id = created.json()["run_id"]
        tried = 0

        @settings(
            max_examples=EXAMPLES,
            phases=[Phase.explicit, Phase.generate],  # no shrinking: report what was found
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(init=INIT_FIELDS, frames=st.lists(frame(), max_size=8))
        @example(init=init_frame(total_slots=0), frames=[])  # the issue's: raised, then hung
        @example(init=init_frame(total_slots=2**63), frames=[])
        @example(init=init_frame(name="n" * 100_000), frames=[])
        @example(init=init_frame(), frames=[plausible_events()])  # a runner that does its job
        def peer(init: dict[str, Any], frames: list[str | bytes]) -> None:
            nonlocal tried
            tried += 1
            try:
                ws = connect(
                    f"{ws_url}/runner/socket",
                    open_timeout=STEP_S,
                    max_size=None,
                    additional_headers=auth_headers(),
                )
            except InvalidStatus as exc:  # pragma: no cover - the upgrade itself refused
                raise AssertionError(f"the upgrade was refused: {exc}") from exc
            with ws:
                ws.send(json.dumps(init))
                assert answered_or_closed(ws), f"Init neither answered nor refused: {init!r:.300}"
                with contextlib.suppress(ConnectionClosed):
                    for sent in frames:
                        ws.send(sent.replace("{run}", run_id) if isinstance(sent, str) else sent)
                        receive_all(ws)
            wait_for(lambda: coordinator.connections.open == 0, "every socket closed")
            for path in READS:
                response = http.get(path)
                assert response.status_code == 200, (path, response.text[:300])

        peer()
        assert tried >= EXAMPLES
        run = http.get(f"/runs/{run_id}")
        assert run.status_code == 200, run.text
