"""Late reports over the coordinator's runner socket, on SQLite and PostgreSQL (a real
uvicorn; runners played by hand, as in ``test_socket_frames``).

A runner whose lease ran out comes back under a new identity and sends what its old one
finished, naming it (``former_runner_id``). The coordinator takes such a report while the
run waits at pending for that attempt, and claims nothing for the new identity before it
is applied (it would claim back the run the report ends), nor for a lease after it
announced reports it does not send. Reports it cannot take — the run went on without
them, or the former identity is not this runner's — are dropped, acknowledged, and the
socket goes on (issue 16 §2).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from test_socket_frames import Served, events, finished, serve, started

from corral.protocol import messages as m

pytestmark = pytest.mark.anyio
LOST_AFTER_S = 15.0


@pytest.fixture
async def served(db_url: str) -> Any:
    async with serve(db_url) as found:
        yield found


async def started_then_cut(served: Served, name: str) -> tuple[str, str]:
    """A runner ``name`` takes a new run and starts it; its socket is cut before the final
    report, and it stays away until declared lost. (runner id, run id)."""
    peer = await served.connect()
    old = (await peer.init(name)).runner_id
    run_id = await served.create_run("true")
    (command,) = (await peer.expect(m.ToClientCommands)).commands
    assert command.body["run"]["run_id"] == run_id
    await peer.send(events(1, started(run_id)))
    assert await peer.expect(m.ToClientAckEvents) == m.ToClientAckEvents(1)
    await peer.close()
    store = served.coordinator.store

    def declare_lost() -> Any:
        with store.db.transaction() as tx:  # silent for long, as if the clock had moved on
            tx.execute(
                "UPDATE runners SET last_heartbeat_at = ? WHERE id = ?",
                (time.time() - 10 * LOST_AFTER_S, old),
            )
        return store.reconcile(
            time.time(), lost_after_s=LOST_AFTER_S, timeout_grace_s=5, up_since=0
        )

    lost = await served.coordinator.in_thread(declare_lost)
    assert lost.lost_runners == [old]
    run = await served.run(run_id)
    assert (run["status"], run["attempts"], run["runner_id"]) == ("pending", 1, None)
    return old, run_id


def late(body: dict[str, Any], former: str) -> dict[str, Any]:
    return {**body, "former_runner_id": former}


async def test_a_late_report_ends_the_run_and_nothing_is_claimed_before(served: Served) -> None:
    old, run_id = await started_then_cut(served, "runner-a")

    peer = await served.connect()
    answer = await peer.init("runner-a", metadata={m.LATE_REPORTS_TO_SEND: 1})
    assert answer.metadata[m.LATE_REPORTS] == 1 and answer.runner_id != old
    # The run is pending, and this runner has a free slot: it is not given it back.
    await peer.nothing_pending()
    await peer.send(events(1, late(started(run_id), old), late(finished(run_id), old)))
    assert await peer.expect(m.ToClientAckEvents) == m.ToClientAckEvents(2)

    run = await served.run(run_id)
    assert (run["status"], run["attempts"], run["runner_id"]) == ("completed", 1, old)
    # Applied, the hold is over: new work comes to the new identity.
    other = await served.create_run("true")
    (command,) = (await peer.expect(m.ToClientCommands)).commands
    assert command.body["run"]["run_id"] == other


async def test_late_reports_the_run_cannot_take_are_dropped(served: Served) -> None:
    old, run_id = await started_then_cut(served, "runner-a")
    # Another runner claims the run again: attempt 2.
    other = await served.connect()
    await other.init("runner-b")
    (command,) = (await other.expect(m.ToClientCommands)).commands
    assert command.body["run"]["attempts"] == 2

    peer = await served.connect()
    await peer.init("runner-a", metadata={m.LATE_REPORTS_TO_SEND: 1})
    await peer.send(events(1, late(finished(run_id), old)))
    assert await peer.expect(m.ToClientAckEvents) == m.ToClientAckEvents(1)
    await peer.nothing_pending()  # no abandon_run: that attempt stopped long ago
    run = await served.run(run_id)
    assert (run["status"], run["attempts"], run["runner_id"]) == (
        "claimed",
        2,
        other.runner_id,
    )


async def test_a_late_report_naming_another_runner_is_dropped(served: Served) -> None:
    """Only a former identity of the same runner (its name, its token) may report late."""
    old, run_id = await started_then_cut(served, "runner-a")
    impostor = await served.connect()
    await impostor.init("runner-z", metadata={m.LATE_REPORTS_TO_SEND: 1})
    await impostor.send(events(1, late(finished(run_id), old)))
    assert await impostor.expect(m.ToClientAckEvents) == m.ToClientAckEvents(1)
    # Not ended by it: the run is still to do, and the impostor, now claiming, gets it.
    (command,) = (await impostor.expect(m.ToClientCommands)).commands
    assert command.body["run"]["run_id"] == run_id and command.body["run"]["attempts"] == 2


async def test_late_reports_announced_and_never_sent_hold_claims_for_a_lease_only(
    db_url: str,
) -> None:
    lease = 2.0
    async with serve(db_url, ws_lost_after_s=lease) as served:
        peer = await served.connect()
        await peer.init("runner-a", metadata={m.LATE_REPORTS_TO_SEND: 1})
        registered = time.monotonic()
        run_id = await served.create_run("true")
        await peer.nothing_pending()  # held: the reports it announced may end a run
        while True:  # pinging, as a live runner does, until the hold ends
            await peer.send(m.ToServerPing(ts=1.0))
            frame = await peer.recv()
            if isinstance(frame, m.ToClientCommands):
                break
            assert frame == m.ToClientPong(ts=1.0)
            await asyncio.sleep(lease / 10)
        assert time.monotonic() - registered >= lease
        (command,) = frame.commands
        assert command.body["run"]["run_id"] == run_id
