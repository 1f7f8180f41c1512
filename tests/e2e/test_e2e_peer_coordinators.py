"""Two ``corral serve`` processes on one PostgreSQL database, a runner given both URLs.

A rolling restart — each coordinator stopped (SIGTERM) and started again, one at a time —
kills no run: the runner moves to the other coordinator within its lease, and the run it
holds goes on, started once. A run created through one coordinator reaches the runner
connected to the other (LISTEN/NOTIFY between them), and so does a cancel, a drain and
a stop. A coordinator stopped with SIGTERM sends its runners to the other at once. The
gateway of one forwards a request for an actor whose runner is connected to the other.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import signal
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import psycopg
import pytest
import websockets
from e2e_support import TOKEN, Cluster, Coordinator, JsonClient, Proc, wait_until
from faultproxy import FaultProxy
from websockets.typing import Subprotocol

from corral.coordinator.peers import FORWARDED_HEADER as FORWARDED

pytestmark = pytest.mark.postgres
WS = ["--transport", "websocket"]
THRESHOLD_S = 12.0  # a runner's lost threshold, where a test waits for one


def held_until_released(root: Path, name: str) -> list[str]:
    """A command that notes each start of it, then runs until the test releases it."""
    starts, release = root / f"{name}.starts", root / f"{name}.go"
    script = f"echo start >> {starts}; while [ ! -e {release} ]; do sleep 0.05; done; echo done"
    return ["sh", "-c", script]


def starts_of(root: Path, name: str) -> int:
    path = root / f"{name}.starts"
    return len(path.read_text().splitlines()) if path.exists() else 0


def restart(cluster: Cluster, coordinator: Coordinator) -> None:
    """Stop it as a deploy does (SIGTERM), wait until it is gone, start it again."""
    coordinator.send(signal.SIGTERM)
    coordinator.wait(30)
    coordinator.start()
    coordinator.wait_ready()
    cluster.reset_client()


def schema_url(pg_url: str, pg_schema: str) -> str:
    """The URL of the test's PostgreSQL schema."""
    return f"{pg_url}{'&' if '?' in pg_url else '?'}options={quote(f'-csearch_path={pg_schema}')}"


def peers(cluster: Cluster, pg_url: str, pg_schema: str) -> tuple[Coordinator, Coordinator]:
    """Two coordinators on the test's PostgreSQL schema."""
    db = schema_url(pg_url, pg_schema)
    return cluster.start_coordinator(db=db), cluster.start_coordinator(db=db)


def test_a_rolling_restart_of_two_coordinators_kills_no_run(
    cluster: Cluster, pg_url: str, pg_schema: str
) -> None:
    a, b = peers(cluster, pg_url, pg_schema)
    cluster.start_runner(
        "runner", url=f"{a.url},{b.url}", slots=4, extra=["--transport", "websocket"]
    )
    via_a, via_b = JsonClient(a.url, TOKEN), JsonClient(b.url, TOKEN)
    root = cluster.root
    try:
        long_run = via_a.create_run("command", command=held_until_released(root, "long"))
        wait_until(lambda: starts_of(root, "long") == 1, 30, what="the long run to start")

        restart(cluster, a)  # the runner was on A: it moves to B
        # Created through A, the run reaches the runner, which is now on B.
        moved = via_a.create_run("command", command=["echo", "through a"])
        assert cluster.wait_run(moved["run_id"])["status"] == "completed"

        restart(cluster, b)  # and back to A
        cancelled = via_b.create_run("command", command=held_until_released(root, "cancel"))
        wait_until(lambda: starts_of(root, "cancel") == 1, 30, what="the run to cancel to start")
        via_b.cancel_run(cancelled["run_id"])  # through B, to the runner on A
        assert cluster.wait_run(cancelled["run_id"])["status"] == "cancelled"

        (root / "long.go").touch()
        finished = cluster.wait_run(long_run["run_id"], timeout=60)
        assert (finished["status"], finished["exit_code"], finished["attempts"]) == (
            "completed",
            0,
            1,
        )
        assert starts_of(root, "long") == 1  # never started again
    finally:
        via_a.close()
        via_b.close()


def test_a_drain_and_a_stop_asked_through_the_other_coordinator_reach_the_runner(
    cluster: Cluster, pg_url: str, pg_schema: str
) -> None:
    """Both runners are connected to B; A stores what was asked, B passes it on."""
    a, b = peers(cluster, pg_url, pg_schema)
    drained = cluster.start_runner(
        "drained", url=b.url, slots=2, extra=[*WS, "--labels", "d"], wait=False
    )
    stopped = cluster.start_runner(
        "stopped", url=b.url, slots=1, extra=[*WS, "--labels", "s"], wait=False
    )
    drained_id, stopped_id = cluster.wait_runner("drained"), cluster.wait_runner("stopped")
    via_a, via_b = JsonClient(a.url, TOKEN), JsonClient(b.url, TOKEN)
    root = cluster.root
    try:
        finishing = via_b.create_run(
            "command", command=held_until_released(root, "finishing"), labels=["d"]
        )
        given_back = via_b.create_run(
            "command", command=held_until_released(root, "given"), labels=["s"]
        )
        wait_until(
            lambda: starts_of(root, "finishing") == starts_of(root, "given") == 1,
            30,
            what="both runs to start",
        )

        via_a.call("POST", f"/runners/{drained_id}/drain", json={"grace_s": 60})
        wait_until(lambda: "asks this runner to drain" in drained.log(), 10, what="the drain")
        assert drained.alive()  # it finishes its run first
        (root / "finishing.go").touch()
        assert drained.wait(30) == 0
        assert cluster.wait_run(finishing["run_id"])["status"] == "completed"

        via_a.call("POST", f"/runners/{stopped_id}/stop")
        assert stopped.wait(30) == 0  # told it is stopped: it does not come back as another
        assert "corral.stopped" in stopped.log()
        run = via_a.get_run(given_back["run_id"])
        assert (run["status"], run["attempts"]) == ("pending", 1), run  # back for another
        assert {r["runner_id"]: r["state"] for r in via_a.runners()} == {
            drained_id: "stopped",
            stopped_id: "stopped",
        }
    finally:
        via_a.close()
        via_b.close()


def connects(runner: Proc) -> int:
    return runner.log().count(" connected (")


def test_sigterm_on_a_coordinator_moves_its_runners_at_once_and_kills_no_run(
    cluster: Cluster, pg_url: str, pg_schema: str
) -> None:
    """A deploy: the coordinator tells its runners to move before it cuts their sockets;
    they go to the other one at once (no failed attempt, no backoff), runs kept."""
    a, b = peers(cluster, pg_url, pg_schema)
    runners = [
        cluster.start_runner(name, url=f"{a.url},{b.url}", slots=2, extra=WS, wait=False)
        for name in ("first", "second")
    ]
    for runner in runners:
        cluster.wait_runner(runner.name)
    via_b = JsonClient(b.url, TOKEN)
    root = cluster.root
    names = [f"held{i}" for i in range(4)]
    try:
        runs = [via_b.create_run("command", command=held_until_released(root, n)) for n in names]
        wait_until(lambda: all(starts_of(root, n) == 1 for n in names), 30, what="every start")

        asked = time.monotonic()
        a.send(signal.SIGTERM)
        wait_until(lambda: all(connects(r) == 2 for r in runners), 10, what="the runners on B")
        print(f"runners moved {time.monotonic() - asked:.3f} s after SIGTERM")
        assert a.wait(30) == 0
        for runner in runners:
            log = runner.log()
            assert "is stopping: moving on, runs kept" in log
            assert "coordinator socket" not in log  # no attempt failed on the way
            assert runner.alive()

        for name in names:
            (root / f"{name}.go").touch()
        for run in runs:
            finished = cluster.wait_run(run["run_id"], timeout=60)
            assert (finished["status"], finished["attempts"]) == ("completed", 1), finished
        assert all(starts_of(root, n) == 1 for n in names)  # none killed, none started again
    finally:
        via_b.close()


def test_sigterm_on_a_coordinator_moves_its_long_poll_runners_at_once_and_kills_no_run(
    cluster: Cluster, pg_url: str, pg_schema: str
) -> None:
    """The same deploy with long-poll runners: their waiting calls are answered
    ``coordinator_leaving`` and they take them to the other coordinator at once. (A lost
    threshold of 10 s: on a loaded machine a registration alone may take most of the
    default 2 s of these tests.)"""
    db = schema_url(pg_url, pg_schema)
    a, b = (cluster.start_coordinator(db=db, lost_after_s=10.0) for _ in range(2))
    runners = [
        cluster.start_runner(name, url=f"{a.url},{b.url}", slots=2, wait=False)
        for name in ("first", "second")
    ]
    for runner in runners:
        cluster.wait_runner(runner.name)
    via_b = JsonClient(b.url, TOKEN)
    root = cluster.root
    names = [f"held{i}" for i in range(4)]
    try:
        runs = [via_b.create_run("command", command=held_until_released(root, n)) for n in names]
        wait_until(lambda: all(starts_of(root, n) == 1 for n in names), 30, what="every start")

        asked = time.monotonic()
        a.send(signal.SIGTERM)
        wait_until(
            lambda: all("moving on, runs kept" in r.log() for r in runners), 10, what="moves"
        )
        print(f"runners moved {time.monotonic() - asked:.3f} s after SIGTERM")
        assert a.wait(30) == 0
        for name in names:
            (root / f"{name}.go").touch()
        for run in runs:
            finished = cluster.wait_run(run["run_id"], timeout=60)
            assert (finished["status"], finished["attempts"]) == ("completed", 1), finished
        assert all(starts_of(root, n) == 1 for n in names)  # none killed, none started again
        for runner in runners:
            assert "coordinator unreachable" not in runner.log()  # no call failed on the way
            assert runner.alive()
    finally:
        via_b.close()


def actors_config(root: Path, markers: Path) -> Path:
    """Two kinds: ``counter`` (HTTP) and ``echo`` (WebSocket only)."""
    config = root / "actors.toml"
    counter = Path(__file__).with_name("counter_actor.py")
    echo = Path(__file__).with_name("echo_ws_actor.py")
    config.write_text(
        f'[actors.counter]\ncommand = ["{sys.executable}", "{counter}"]\n'
        f'env = {{ MARKERS = "{markers}" }}\n'
        f'[actors.echo]\ncommand = ["{sys.executable}", "{echo}"]\n'
    )
    return config


async def echoed_through(url: str, actor_id: str, text: str) -> tuple[str | None, object, int]:
    """A WebSocket to the echo actor through ``url``'s gateway: its subprotocol, the echo
    of ``text``, and the code it closed with after ``bye``."""
    address = url.replace("http://", "ws://") + f"/gateway/{actor_id}/"
    async with websockets.connect(
        address,
        additional_headers={"authorization": f"Bearer {TOKEN}"},
        subprotocols=[Subprotocol("echo")],
    ) as ws:
        await ws.send(text)
        echoed = await asyncio.wait_for(ws.recv(), 30)
        await ws.send("bye")
        with contextlib.suppress(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 30)
        return ws.subprotocol, echoed, ws.close_code or 0


def test_the_gateway_forwards_to_the_coordinator_holding_the_runner_and_follows_it(
    cluster: Cluster, pg_url: str, pg_schema: str
) -> None:
    """The actor's runner is connected to B; requests come to A, which forwards them (the
    body streamed both ways). B is killed: the runner moves to A, which now owns its socket
    and answers through its own tunnel. Each request ran once."""
    a, b = peers(cluster, pg_url, pg_schema)
    markers = cluster.root / "markers"
    markers.touch()
    config = actors_config(cluster.root, markers)
    cluster.start_runner("host", url=f"{b.url},{a.url}", extra=[*WS, "--config", str(config)])
    runner_id = cluster.wait_runner("host")
    via_a = JsonClient(a.url, TOKEN)
    http_a = httpx.Client(base_url=a.url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=30)
    try:
        actor_id = via_a.call("POST", "/actors", json={"name": "counter", "key": "c"})["actor_id"]
        echo_id = via_a.call("POST", "/actors", json={"name": "echo", "key": "e"})["actor_id"]
        wait_until(
            lambda: (
                {via_a.call("GET", f"/actors/{i}")["state"] for i in (actor_id, echo_id)}
                == {"running"}
            ),
            30,
            what="the actors running",
        )

        def owner() -> str | None:
            (runner,) = [r for r in via_a.runners() if r["runner_id"] == runner_id]
            return runner["coordinator_url"]

        assert owner() == b.url
        assert http_a.get(f"/gateway/{actor_id}/hit/one").text == "one"
        body = bytes(range(256)) * 800  # 200 KiB: several tunnel chunks each way
        echoed = http_a.post(f"/gateway/{actor_id}/echo/two", content=body)
        assert (echoed.status_code, echoed.content) == (200, body)
        by_key = http_a.get("/gateway/counter/hit/three", params={"key": "c"})
        assert (by_key.status_code, by_key.text) == (200, "three")
        assert asyncio.run(echoed_through(a.url, echo_id, "hello")) == ("echo", "hello", 1000)
        # Marked as forwarded by a peer, a request is never forwarded again: A says the
        # runner is not here, and the peer that sent it would look again.
        marked = http_a.get(f"/gateway/{actor_id}/hit/never", headers={FORWARDED: b.url})
        assert (marked.status_code, marked.headers.get("x-corral-error")) == (
            503,
            "runner_not_here",
        )

        b.kill()  # SIGKILL: the runner's socket is owned by a dead coordinator
        wait_until(lambda: owner() == a.url, 30, what="the runner re-owned by A")
        assert http_a.get(f"/gateway/{actor_id}/hit/four").text == "four"
        assert markers.read_text().split() == ["one", "two", "three", "four"]
    finally:
        http_a.close()
        via_a.close()


def test_a_request_whose_runner_went_to_the_other_coordinator_and_back_gets_an_answer(
    cluster: Cluster, pg_url: str, pg_schema: str
) -> None:
    """A request through A reaches the actor; the runner's link to A breaks and it moves to
    B, where the actor's answer goes (B never asked for it); then it comes back to A. A's
    request must end — 503 ``tunnel_lost``, the runner has nothing more of it — as soon as
    the runner is back, not wait for an answer that will never come; and the next request
    through A is answered."""
    a, b = peers(cluster, pg_url, pg_schema)
    markers = cluster.root / "markers"
    markers.touch()
    config = actors_config(cluster.root, markers)
    with FaultProxy(a.port) as to_a, FaultProxy(b.port) as to_b:
        urls = f"{to_a.url},{to_b.url}"
        cluster.start_runner("host", url=urls, extra=[*WS, "--config", str(config)])
        runner_id = cluster.wait_runner("host")
        via_a = JsonClient(a.url, TOKEN)
        http_a = httpx.Client(base_url=a.url, headers={"authorization": f"Bearer {TOKEN}"})

        def owner() -> str | None:
            (runner,) = [r for r in via_a.runners() if r["runner_id"] == runner_id]
            return runner["coordinator_url"]

        try:
            actor_id = via_a.call("POST", "/actors", json={"name": "counter", "key": "c"})[
                "actor_id"
            ]
            wait_until(
                lambda: via_a.call("GET", f"/actors/{actor_id}")["state"] == "running",
                30,
                what="the actor running",
            )
            assert owner() == a.url
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                held = pool.submit(http_a.get, f"/gateway/{actor_id}/held/x", timeout=60)
                wait_until(lambda: markers.read_text().split() == ["x"], 30, what="x taken")
                to_a.refusing = True  # the runner's link to A breaks: it moves to B
                to_a.cut_all("both")
                wait_until(lambda: owner() == b.url, 30, what="the runner on B")
                # The actor answers now: its answer goes to B, which never asked for it.
                sent, heard = to_b.stats.bytes_up, to_b.stats.bytes_down
                (markers.parent / "markers.x.go").touch()
                wait_until(
                    lambda: to_b.stats.bytes_up > sent and to_b.stats.bytes_down > heard,
                    30,
                    what="the answer sent to B, and B's word on it",
                )
                to_a.refusing, to_b.refusing = False, True  # back to A
                to_b.cut_all("both")
                wait_until(lambda: owner() == a.url, 30, what="the runner back on A")
                answer = held.result(timeout=30)
            assert (answer.status_code, answer.json()["error"]["code"]) == (503, "tunnel_lost")
            (markers.parent / "markers.y.go").touch()
            assert http_a.get(f"/gateway/{actor_id}/held/y", timeout=30).text == "y"
            assert markers.read_text().split() == ["x", "y"]  # each ran once
        finally:
            http_a.close()
            via_a.close()


def newest_coordinator(db: str) -> str | None:
    """The node name of the coordinator that started last, once it has made a pass."""
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT node FROM coordinators ORDER BY up_since DESC").fetchone()
    return None if row is None else str(row[0])


def hand_the_reconciler_to(db: str, holder: str, for_s: float) -> None:
    """Give the reconciler's lease to ``holder`` for ``for_s`` (a coordinator renews it)."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "UPDATE coordinator_leases SET holder = %s, expires_at = %s WHERE name = 'reconciler'",
            (holder, time.time() + for_s),
        )


def test_a_runner_killed_before_a_coordinator_restart_is_lost_a_threshold_after_the_kill(
    cluster: Cluster, pg_url: str, pg_schema: str
) -> None:
    """A runner is killed; half a threshold later A is killed and started again while B
    stays up, and the new A holds the reconciler's lease (as it may, winning it when the
    old one's lease ends: the test holds it meanwhile and hands it to the new A). The
    runner's runs start again a threshold after the kill — B was up to hear it — or as
    soon as the new A reconciles, not a threshold after A's restart."""
    lost_after = ["--runner-lost-threshold", str(THRESHOLD_S)]
    db = schema_url(pg_url, pg_schema)
    a, b = (
        cluster.start_coordinator(db=db, lost_after_s=THRESHOLD_S, extra=lost_after)
        for _ in range(2)
    )
    doomed = cluster.start_runner("doomed", url=f"{a.url},{b.url}", slots=2, extra=WS)
    root = cluster.root
    names = ["held0", "held1"]
    via_b = JsonClient(b.url, TOKEN)
    try:
        runs = [via_b.create_run("command", command=held_until_released(root, n)) for n in names]
        wait_until(lambda: all(starts_of(root, n) == 1 for n in names), 30, what="every start")
        doomed.send(signal.SIGKILL)
        assert doomed.wait(10) == -signal.SIGKILL
        killed_at = time.monotonic()
        cluster.start_runner("spare", url=b.url, slots=2, extra=WS)  # to run them again
        # Half a threshold later, A is killed and started again: counting only itself as
        # able to hear the runner, the new A would wait a threshold from its start.
        time.sleep(max(0.0, killed_at + THRESHOLD_S / 2 - time.monotonic()))
        before = newest_coordinator(db)
        hand_the_reconciler_to(db, "the test", 60.0)  # neither A nor B reconciles now
        a.kill()
        restarted_at = time.monotonic()
        a.start()
        a.wait_ready()
        new_a = wait_until(lambda: (n := newest_coordinator(db)) != before and n, 30)
        hand_the_reconciler_to(db, new_a, 5.0)
        wait_until(lambda: all(starts_of(root, n) == 2 for n in names), 60, what="restarts")
        started_again = time.monotonic()
        print(
            f"started again {started_again - killed_at:.1f} s after the kill, "
            f"{started_again - restarted_at:.1f} s after A's restart (threshold {THRESHOLD_S} s)"
        )
        assert started_again < restarted_at + THRESHOLD_S  # not a threshold after the restart
        for name in names:
            (root / f"{name}.go").touch()
        for run in runs:
            finished = cluster.wait_run(run["run_id"], timeout=60)
            assert (finished["status"], finished["attempts"]) == ("completed", 2), finished
    finally:
        via_b.close()


def test_a_coordinator_started_while_postgresql_is_unreachable_waits_for_it_and_serves(
    cluster: Cluster, pg_url: str, pg_schema: str
) -> None:
    """A coordinator started in an outage (here: a proxy to PostgreSQL that refuses every
    connection) says why it waits and tries again, rather than exit; once PostgreSQL can be
    reached it serves, and a runner started meanwhile runs a run through it."""
    parts = urlsplit(pg_url)
    with FaultProxy(parts.port or 5432, target_host=parts.hostname or "127.0.0.1") as proxy:
        proxy.refusing = True
        via_proxy = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
        coordinator = cluster.start_coordinator(db=schema_url(via_proxy, pg_schema), wait=False)
        wait_until(
            lambda: coordinator.log().count("trying again in") >= 2,
            30,
            what="two tries, each saying why",
        )
        assert coordinator.alive() and not coordinator.healthy()
        # The reason libpq gave: the proxy takes the connection, then resets it at once, and
        # libpq tells it one way or the other as the reset meets its startup packet or not.
        said = coordinator.log()
        assert any(
            f"{why}; trying again" in said
            for why in ("server closed the connection unexpectedly", "Connection reset by peer")
        ), said
        proxy.refusing = False
        coordinator.wait_ready()
        cluster.start_runner("r1", extra=WS)
        run = cluster.client.create_run("command", command=["echo", "served"])
        assert cluster.wait_run(run["run_id"])["status"] == "completed"
