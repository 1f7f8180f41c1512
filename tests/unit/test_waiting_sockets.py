"""Which waiting runner sockets a round wakes (``coordinator.waiters``), without I/O."""

from __future__ import annotations

from corral.coordinator.waiters import BLIND_WAKES, SocketWaiters, Waiter, after_claim
from corral.ids import RunId
from corral.store.claims import Claimable


def run(run_id: str, *labels: str, runner: str | None = None) -> Claimable:
    return Claimable(RunId(run_id), runner, frozenset(labels))


class Woken:
    """The wake-ups of the waiters made with ``waiter``."""

    def __init__(self) -> None:
        self.calls: dict[str, list[RunId] | None] = {}

    def waiter(
        self, name: str, *labels: str, free: int = 1, declined: tuple[str, ...] = ()
    ) -> Waiter:
        def wake(runs: list[RunId] | None) -> None:
            self.calls[name] = runs

        return Waiter(name, frozenset(labels), free, wake, frozenset(map(RunId, declined)))


def wake_all(
    waiters: SocketWaiters, claimable: list[Claimable], complete: bool = True
) -> set[RunId]:
    reserved: set[RunId] = set()
    for waiter, runs in waiters.assign(claimable, reserved, complete):
        waiter.wake(runs)
    return reserved


def test_a_run_wakes_the_oldest_waiter_it_fits_and_no_other() -> None:
    woken, waiters = Woken(), SocketWaiters()
    for i in range(100):
        waiters.add(woken.waiter(f"idle-{i}"))
    waiters.add(woken.waiter("gpu-1", "gpu"))
    waiters.add(woken.waiter("gpu-2", "gpu", "linux"))
    assert wake_all(waiters, [run("r1", "gpu"), run("r2", "arm")]) == {"r1"}
    assert woken.calls == {"gpu-1": ["r1"]}
    assert len(waiters) == 101  # the one woken left the line


def test_a_waiter_takes_as_many_runs_as_it_has_free_slots() -> None:
    woken, waiters = Woken(), SocketWaiters()
    waiters.add(woken.waiter("a", free=2))
    waiters.add(woken.waiter("b", free=2))
    wake_all(waiters, [run(f"r{i}") for i in range(5)])
    assert woken.calls == {"a": ["r0", "r1"], "b": ["r2", "r3"]}
    assert not waiters


def test_runs_already_reserved_and_runs_a_waiter_declined_are_not_given_to_it() -> None:
    woken, waiters = Woken(), SocketWaiters()
    waiters.add(woken.waiter("a", declined=("r1",)))
    waiters.add(woken.waiter("b"))
    reserved = {RunId("r0")}  # a long-poll of this round took it
    for waiter, runs in waiters.assign([run("r0"), run("r1"), run("r2")], reserved, True):
        waiter.wake(runs)
    assert woken.calls == {"b": ["r1"], "a": ["r2"]}


def test_a_run_that_requires_a_runner_wakes_that_runner_only() -> None:
    woken, waiters = Woken(), SocketWaiters()
    waiters.add(woken.waiter("a"))
    waiters.add(woken.waiter("b"))
    wake_all(waiters, [run("r1", runner="b"), run("r2", runner="gone")])
    assert woken.calls == {"b": ["r1"]}


def test_an_incomplete_read_wakes_a_bounded_number_without_reservation() -> None:
    woken, waiters = Woken(), SocketWaiters()
    for i in range(3 * BLIND_WAKES):
        waiters.add(woken.waiter(f"idle-{i}", "linux" if i % 2 else "arm"))
    wake_all(waiters, [run("r1", "gpu")], complete=False)
    assert list(woken.calls.values()) == [None] * BLIND_WAKES
    assert len(waiters) == 2 * BLIND_WAKES


def test_a_socket_that_missed_its_reservation_passes_the_wake_on() -> None:
    got, missed = after_claim([RunId("r1")], [], frozenset())
    assert (got, missed) == ({"r1"}, True)
    assert after_claim([RunId("r1")], ["r1"], frozenset({RunId("r0")})) == (frozenset(), False)
    assert after_claim([RunId("r1")], ["r2"], frozenset()) == (frozenset(), True)
    # Not woken by a round (or woken without a reservation): nothing to pass on.
    assert after_claim(None, [], frozenset({RunId("r0")})) == ({"r0"}, False)
