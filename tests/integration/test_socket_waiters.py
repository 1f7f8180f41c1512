"""A new run wakes only the runner sockets that can take it (SQLite and PostgreSQL).

Every socket's push loop used to try a claim (a write transaction) at each new run: with
10,000 idle sockets one run cost 10,000 claims, and the event loop starved until their
pings went unanswered. Now a socket waits among the socket waiters only while its runner
has a free slot, and a round wakes those a run fits (``coordinator.waiters``). Runners are
played by hand over a real uvicorn (``test_socket_frames``); ``claim_into_commands`` is
wrapped to count the claims each runner makes (the real store does the work).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from api_fixtures import wait_until
from test_socket_frames import Peer, Served, events, finished, serve

from corral.coordinator import service
from corral.protocol import messages as m
from corral.runs import NewRun, RunType
from corral.store.commands import CommandStore
from corral.store.runs import RunStore

pytestmark = pytest.mark.anyio
IDLE = 20  # sockets whose runner has a free slot but none of the labels asked
FULL = 5  # sockets whose runner's one slot is taken


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runner of every claim a socket's push loop tries."""
    tried: list[str] = []
    claim = CommandStore.claim_into_commands

    def counted(commands: CommandStore, runner_id: str, *args: Any) -> Any:
        tried.append(runner_id)
        return claim(commands, runner_id, *args)

    monkeypatch.setattr(CommandStore, "claim_into_commands", counted)
    return tried


@pytest.fixture
async def served(db_url: str) -> AsyncIterator[Served]:
    async with serve(db_url) as found:
        yield found


async def connect(served: Served, name: str, labels: tuple[str, ...] = ()) -> Peer:
    peer = await served.connect()
    await peer.init(name, labels=labels)
    return peer


async def create(served: Served, *labels: str) -> str:
    body = {"type": "command", "command": ["true"], "labels": list(labels)}
    response = await served.http.post("/runs", json=body)
    assert response.status_code == 201, response.text
    run_id: str = response.json()["run_id"]
    return run_id


async def receive_start(peer: Peer) -> m.Indexed:
    """The next command sent to ``peer`` (acknowledgements of its events skipped): a start."""
    message = await peer.recv()
    while isinstance(message, m.ToClientAckEvents):
        message = await peer.recv()
    assert isinstance(message, m.ToClientCommands), message
    (command,) = message.commands
    assert command.body["type"] == "start_run", command
    return command


async def test_a_new_run_wakes_only_a_socket_it_fits_that_has_a_free_slot(
    served: Served, claims: list[str]
) -> None:
    coordinator = served.coordinator
    idle = [await connect(served, f"idle-{i}") for i in range(IDLE)]
    full = [await connect(served, f"full-{i}", ("linux",)) for i in range(FULL)]
    probe = await connect(served, "probe", ("probe",))
    for _ in full:
        await create(served, "linux")
    held = [(await receive_start(peer)).body["run"] for peer in full]  # one each: full
    await wait_until(
        lambda: len(coordinator.waiters) == len(idle) + 1, what="the idle sockets waiting"
    )
    before = len(claims)

    # Runs no idle socket fits, and one for runners whose slot is taken: nobody claims.
    await create(served, "gpu")
    waiting = await create(served, "linux")
    # Then a run for the probe: its socket alone is woken, and claims it.
    probed = await create(served, "probe")
    assert (await receive_start(probe)).body["run"]["run_id"] == probed
    assert claims[before:] == [probe.runner_id]
    assert (await served.run(waiting))["status"] == "pending"

    # A slot comes free: that runner claims the waiting run.
    await full[0].send(events(1, finished(held[0]["run_id"], held[0]["attempts"])))
    assert (await receive_start(full[0])).body["run"]["run_id"] == waiting


async def test_a_run_goes_to_the_one_socket_among_many_it_fits(
    served: Served, claims: list[str]
) -> None:
    coordinator = served.coordinator
    for i in range(IDLE):
        await connect(served, f"idle-{i}")
    gpu = await connect(served, "gpu-box", ("gpu",))
    await wait_until(lambda: len(coordinator.waiters) == IDLE + 1, what="every socket waiting")
    before = len(claims)
    run_id = await create(served, "gpu")
    assert (await receive_start(gpu)).body["run"]["run_id"] == run_id
    assert claims[before:] == [gpu.runner_id]


async def test_a_run_created_without_a_wake_up_is_found_by_the_rescan(db_url: str) -> None:
    """A run no notification announced (as if a wake-up was lost on the way) reaches the
    waiting socket it fits at the next round made without one (``poll_timeout_s``)."""
    async with serve(db_url, poll_timeout_s=0.5) as served:
        coordinator = served.coordinator
        peer = await connect(served, "runner-a")
        await wait_until(lambda: len(coordinator.waiters) == 1, what="the socket waiting")
        new = NewRun(type=RunType.COMMAND, command=("true",))
        (run,) = await asyncio.to_thread(
            coordinator.store.runs.create_many, [new], coordinator.clock.now()
        )
        assert (await receive_start(peer)).body["run"]["run_id"] == run.id


async def test_a_run_created_while_a_socket_it_fits_waits_is_claimed_in_its_own_commit(
    served: Served, claims: list[str]
) -> None:
    """The socket's claim joins the create's group (one commit): the run is the runner's
    by the time its creator hears of it, with no round of the socket waiters between."""
    coordinator = served.coordinator
    peer = await connect(served, "runner-a", ("linux",))
    await wait_until(lambda: len(coordinator.waiters) == 1, what="the socket waiting")
    before = len(claims)
    run_id = await create(served, "linux")
    assert (await served.run(run_id))["status"] == "claimed"
    assert claims[before:] == [peer.runner_id]
    assert (await receive_start(peer)).body["run"]["run_id"] == run_id


async def test_a_refused_create_leaves_the_woken_socket_claiming_the_next_run(
    served: Served,
) -> None:
    coordinator = served.coordinator
    peer = await connect(served, "runner-a")
    await wait_until(lambda: len(coordinator.waiters) == 1, what="the socket waiting")
    refused = await served.http.post("/runs", json={"type": "command", "command": [""]})
    assert refused.status_code == 422, refused.text
    await wait_until(lambda: len(coordinator.waiters) == 1, what="the socket waiting again")
    run_id = await create(served)
    assert (await receive_start(peer)).body["run"]["run_id"] == run_id


async def test_a_batch_is_claimed_by_every_waiting_socket_it_fits_in_its_commit(
    served: Served,
) -> None:
    coordinator = served.coordinator
    peers = [await connect(served, f"runner-{i}") for i in range(3)]
    await wait_until(lambda: len(coordinator.waiters) == 3, what="the sockets waiting")
    body = {"type": "command", "command": ["true"]}
    response = await served.http.post("/runs:batch", json={"runs": [body] * 4})
    assert response.status_code == 201, response.text
    statuses = [(await served.run(r["run_id"]))["status"] for r in response.json()["runs"]]
    assert sorted(statuses) == ["claimed"] * 3 + ["pending"]  # one slot a runner
    started = {(await receive_start(peer)).body["run"]["run_id"] for peer in peers}
    assert len(started) == 3


async def test_a_run_stored_before_its_socket_is_woken_reaches_it_without_a_round(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs that cannot join a socket's claim (a resume: its runner is known once built;
    or no socket waited when the create began) are offered once stored, with their
    reservations, as a round would: without the round's read of the claimable runs."""
    monkeypatch.setattr(service, "_offerable", lambda bodies, principal: False)
    reads: list[int] = []
    claimable = RunStore.claimable

    def counted(runs: RunStore, *args: Any) -> Any:
        reads.append(1)
        return claimable(runs, *args)

    monkeypatch.setattr(RunStore, "claimable", counted)
    coordinator = served.coordinator
    peer = await connect(served, "runner-a")
    await wait_until(lambda: len(coordinator.waiters) == 1, what="the socket waiting")
    before = len(reads)
    run_id = await create(served)
    assert (await receive_start(peer)).body["run"]["run_id"] == run_id
    assert len(reads) == before
