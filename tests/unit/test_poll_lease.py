"""A long-poll runner's lease (``corral.runner.lease``): its runs stay its own until a
threshold after the last answered registration or heartbeat, less the time stopping takes;
then ``PollTransport`` stops all its work, before the coordinator gives it to others."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from corral.ids import RunId, RunnerId
from corral.runner.lease import Lease
from corral.runner.link import LinkDown, Registration
from corral.runner.outbox import Outbox
from corral.runner.poll import PollTransport
from corral.runner.settings import RunnerSettings
from corral.runners import Held


def test_the_lease_runs_from_the_last_answered_call_less_the_stop_margin() -> None:
    lease = Lease(stop_margin_s=6.0)
    assert lease.ends_at() is None  # nothing answered yet
    lease.threshold_s = 20.0
    lease.heard(100.0)
    assert lease.ends_at() == 114.0  # 20 s less the 6 s that stopping takes
    lease.heard(99.0)  # the answer to an older request: the lease does not go back
    assert lease.ends_at() == 114.0
    lease.threshold_s = 3.0
    assert lease.ends_at() == 102.0  # the margin is at most a third of the threshold


def test_it_lapses_once_and_an_answer_starts_it_again() -> None:
    lease = Lease(stop_margin_s=1.0)
    lease.threshold_s = 5.0
    lease.heard(0.0)
    assert not lease.lapse(3.9)
    assert lease.lapse(4.0)
    assert not lease.lapse(10.0)  # told once
    assert lease.ends_at() is None
    lease.heard(2.0)  # sent before it lapsed, answered after: it counts from 2
    assert lease.ends_at() == 6.0
    assert lease.lapse(10.0)
    lease.heard(11.0)
    assert lease.ends_at() == 15.0


def test_without_a_threshold_no_lease_is_kept() -> None:
    lease = Lease(stop_margin_s=1.0)  # an older coordinator did not say its threshold
    lease.heard(0.0)
    assert not lease.lapse(1e9)
    assert lease.answer_wait_s() is None
    assert lease.retry_in(5.0, backoff_s=30.0) == 30.0


def test_waits_fit_inside_the_lease() -> None:
    lease = Lease(stop_margin_s=1.0)
    lease.threshold_s = 9.0
    lease.heard(0.0)  # ends at 8
    assert lease.answer_wait_s() == 4.0  # a hanging heartbeat gives up at half the lease
    assert lease.retry_in(0.0, backoff_s=30.0) == 2.0  # a quarter of what is left
    assert lease.retry_in(0.0, backoff_s=0.5) == 0.5
    assert lease.retry_in(7.99, backoff_s=30.0) == 0.1  # never busy-looping
    lease.threshold_s = 1.5
    assert lease.answer_wait_s() == 1.0  # never less than a second


class SilentLink:
    """Registers the runner (lost after 0.3 s), then answers no heartbeat."""

    coordinators = 1  # as HttpLink's: how many it moves between on failures

    def __init__(self, *, answering: bool) -> None:
        self.answering = answering
        self.heartbeats = 0
        self.answered_for_a_while = asyncio.Event()  # 45 heartbeats: three leases and more

    async def register(self, **_: Any) -> Registration:
        return Registration(RunnerId("rnr_1"), 0.02, 30.0, abandon=[], lost_after_s=0.3)

    async def heartbeat(
        self, runner_id: RunnerId, held: list[Held], timeout_s: float | None = None
    ) -> list[RunId]:
        self.heartbeats += 1
        if not self.answering:
            raise LinkDown("unreachable")
        await asyncio.sleep(0.005)  # an answer takes a moment
        if self.heartbeats >= 45:
            self.answered_for_a_while.set()
        return []

    async def poll(self, *_: Any) -> list[dict[str, Any]]:
        await asyncio.Event().wait()
        return []

    async def control(self, *_: Any) -> list[Any]:
        await asyncio.Event().wait()
        return []

    async def deregister(self, runner_id: RunnerId) -> None:
        pass

    async def aclose(self) -> None:
        pass


class HoldingHost:
    """Holds one run until told to stop all work."""

    def __init__(self) -> None:
        self.stopped = asyncio.Event()

    def held(self) -> list[Held]:
        return [] if self.stopped.is_set() else [Held(RunId("run_a"), 1)]

    def stop_all_work(self) -> None:
        self.stopped.set()

    async def slot_freed(self) -> None:
        await asyncio.Event().wait()

    @property
    def free_slots(self) -> int:
        return 0


@pytest.mark.anyio
@pytest.mark.parametrize("answering", [False, True])
async def test_a_runner_unheard_past_its_lease_stops_its_work(answering: bool) -> None:
    link, host = SilentLink(answering=answering), HoldingHost()
    transport = PollTransport(host, RunnerSettings(), link=link)  # type: ignore[arg-type]
    await transport.open()
    serving = asyncio.create_task(transport.serve())
    try:
        if answering:  # heartbeats answered for three leases: the work goes on
            await asyncio.wait_for(link.answered_for_a_while.wait(), 10.0)
            assert not host.stopped.is_set()
        else:  # the lease (0.3 s less a third) runs out: stopped at once
            await asyncio.wait_for(host.stopped.wait(), 10.0)
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


@pytest.mark.anyio
async def test_a_runner_that_was_not_running_asks_the_coordinator_before_stopping() -> None:
    """Suspended past its lease (the whole process, its event loop too), the runner could
    stop nothing meanwhile; on waking it asks with a heartbeat, and the coordinator, which
    still counts it in, answers: the work goes on."""
    link, host = SilentLink(answering=True), HoldingHost()
    transport = PollTransport(host, RunnerSettings(), link=link)  # type: ignore[arg-type]
    await transport.open()
    serving = asyncio.create_task(transport.serve())
    try:
        await asyncio.sleep(0.1)
        time.sleep(1.5)  # noqa: ASYNC251 (suspended: nothing runs, the 0.2 s lease ends)
        link.answered_for_a_while.clear()
        link.heartbeats = 0
        await asyncio.wait_for(link.answered_for_a_while.wait(), 10.0)
        assert not host.stopped.is_set()
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


class ClaimingLink(SilentLink):
    """Answers no heartbeat, but every poll, each with a run claimed: a claim writes the
    runner's heartbeat (``store/claims.py``)."""

    def __init__(self) -> None:
        super().__init__(answering=False)
        self.claims = 0

    async def poll(self, *_: Any) -> list[dict[str, Any]]:
        await asyncio.sleep(0.02)
        self.claims += 1
        if self.claims >= 45:  # three leases and more
            self.answered_for_a_while.set()
        return [{"run_id": f"run_{self.claims}"}]


class TakingHost(HoldingHost):
    """Takes every run it is given, with a slot always free."""

    def start(self, assignment: dict[str, Any]) -> None:
        pass

    @property
    def free_slots(self) -> int:
        return 1


@pytest.mark.anyio
async def test_answered_claims_keep_the_lease_without_heartbeats() -> None:
    link, host = ClaimingLink(), TakingHost()
    transport = PollTransport(host, RunnerSettings(), link=link)  # type: ignore[arg-type]
    await transport.open()
    serving = asyncio.create_task(transport.serve())
    try:
        await asyncio.wait_for(link.answered_for_a_while.wait(), 10.0)
        assert link.heartbeats > 0  # they were tried, and went unanswered
        assert not host.stopped.is_set()
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


class ReportingLink(SilentLink):
    """Its first report request fails (the coordinator away), every one after is answered;
    it records the order of what the runner asked."""

    def __init__(self) -> None:
        super().__init__(answering=True)
        self.calls: list[str] = []
        self.refused = asyncio.Event()

    async def events(
        self, runner_id: RunnerId, events: list[dict[str, Any]], *_: Any
    ) -> list[None]:
        self.calls.append("events")
        if self.calls.count("events") == 1:
            self.refused.set()
            raise LinkDown("unreachable")
        return [None] * len(events)

    async def poll(self, *_: Any) -> list[dict[str, Any]]:
        self.calls.append("poll")
        return []


@pytest.mark.anyio
async def test_registered_again_the_runner_reports_before_it_claims() -> None:
    """A final report of work done while the runner was away goes before its next claim,
    at once (not after the report's backoff): the coordinator may still end the run with it
    (a late report) — claimed first, the run would go to this runner again, and run twice."""
    link, host = ReportingLink(), TakingHost()
    settings = RunnerSettings(max_backoff_s=30.0)
    transport = PollTransport(host, settings, link=link)  # type: ignore[arg-type]
    await transport.open()
    sending = asyncio.create_task(transport.reports.run())
    try:
        report = transport.reports.send({"type": "finished", "run_id": "run_a", "attempt": 1})
        await asyncio.wait_for(link.refused.wait(), 5.0)  # now waiting out its backoff
        await transport._register()  # registered again (its lease had run out)
        await asyncio.wait_for(transport._claim(), 0.5)  # far less than the backoff
        assert report.done() and report.exception() is None
        assert link.calls == ["events", "events", "poll"]
        await transport._claim()  # once only: later claims wait for nothing
        assert link.calls[-1] == "poll"
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)


class RoundOfCoordinators(SilentLink):
    """Three coordinators, the first ``failures`` registrations and report requests
    unreachable (the link moves to the next coordinator on each, as ``HttpLink`` does)."""

    coordinators = 3

    def __init__(self, failures: int) -> None:
        super().__init__(answering=True)
        self.failures = failures
        self.registrations = 0
        self.requests = 0

    async def register(self, **fields: Any) -> Registration:
        self.registrations += 1
        if self.registrations <= self.failures:
            raise LinkDown("connection refused")
        return await super().register(**fields)

    async def events(
        self, runner_id: RunnerId, events: list[dict[str, Any]], *_: Any
    ) -> list[None]:
        self.requests += 1
        if self.requests <= self.failures:
            raise LinkDown("connection refused")
        return [None] * len(events)


def recorded_backoffs(monkeypatch: pytest.MonkeyPatch, module: str) -> list[int]:
    """The attempt numbers ``module``'s backoffs are computed for (each a short wait)."""
    waits: list[int] = []

    def backoff_delay(attempt: int, **_: Any) -> float:
        waits.append(attempt)
        return 0.01

    monkeypatch.setattr(f"{module}.backoff_delay", backoff_delay)
    return waits


@pytest.mark.anyio
@pytest.mark.parametrize(("failures", "backoffs"), [(2, 0), (3, 1), (5, 1), (6, 2)])
async def test_a_failed_call_tries_the_other_coordinators_before_it_backs_off(
    failures: int, backoffs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next coordinator at once, as the WebSocket runner does: the backoff is for a
    round in which every one failed."""
    waits = recorded_backoffs(monkeypatch, "corral.runner.poll")
    link = RoundOfCoordinators(failures)
    transport = PollTransport(HoldingHost(), RunnerSettings(), link=link)  # type: ignore[arg-type]
    await transport.open()
    assert link.registrations == failures + 1
    assert waits == list(range(backoffs))  # one backoff a round, growing


@pytest.mark.anyio
@pytest.mark.parametrize(("failures", "backoffs"), [(2, 0), (3, 1), (6, 2)])
async def test_reports_try_the_other_coordinators_before_they_back_off(
    failures: int, backoffs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits = recorded_backoffs(monkeypatch, "corral.runner.outbox")
    link = RoundOfCoordinators(failures)
    outbox = Outbox(link, lambda: RunnerId("rnr_1"))  # type: ignore[arg-type]
    sending = asyncio.create_task(outbox.run())
    try:
        report = outbox.send({"type": "finished", "run_id": "run_a", "attempt": 1})
        await asyncio.wait_for(report, 5.0)
        assert link.requests == failures + 1
        assert waits == list(range(backoffs))
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
