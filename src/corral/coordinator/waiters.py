"""Runner sockets waiting for work, and which of them a new run wakes.

Every WebSocket runner's push loop used to wait on ``RUNS_AVAILABLE`` and try a claim (a
write transaction) each time it was woken: one new run cost a claim per connected socket,
and 10,000 idle sockets starved the event loop until their pings went unanswered. Now a
socket waits here only while its runner has a free slot (the store said so at the end of
its last claim), and a round matches the runs the claim board read against the waiting
sockets in memory (``SocketWaiters.assign``): only a socket a run was reserved for is woken,
and claims.

    new run ──▶ notify RUNS_AVAILABLE ──▶ one round (``Coordinator.dispatch_forever``):
        one read of the claimable runs (the claim board's, shared with the long-polls)
        ──▶ each run not reserved yet goes to the first waiting socket it fits
        ──▶ that socket is woken with its reservation, claims, and waits again if it
            still has a free slot

A run a client creates skips the round when sockets it fits wait as it arrives: they are
matched by its labels and woken at once, and their claims join the create's own commit
(``Coordinator.create_runs``); runs stored first are matched as the round would, without
its read. A woken socket's claim is queued as it is woken (``SocketPump._wake``).

A woken socket that did not get what was reserved for it (another coordinator took the
run, one earlier in the queue came first) notifies ``RUNS_AVAILABLE`` again: a fresh round
gives what is left to others. It is not offered the runs it missed again until it claimed
(``declined``), so a run no socket can take costs at most one claim per fitting socket.
A read that may be incomplete (``READ_LIMIT`` runs) wakes at most ``BLIND_WAKES`` of the
sockets it has nothing for, to claim without a reservation; they go to the back of the
line. What a lost wake-up would leave pending is found by the round run every
``poll_timeout_s`` without one (one read, not one claim per socket).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from corral.ids import RunId
from corral.store.claims import Claimable

# Sockets woken per round, beyond reservations, when the read may have missed runs.
BLIND_WAKES = 8

K = TypeVar("K")

# A socket's wake-up: the runs reserved for it, or None to claim without a reservation.
Wake = Callable[[list[RunId] | None], None]


@dataclass(eq=False)
class Waiter:
    """A runner socket with ``free`` slots waiting for runs."""

    name: str  # the runner's name (a run may require it)
    labels: frozenset[str]
    free: int
    wake: Wake
    declined: frozenset[RunId] = frozenset()  # reserved for it before, not taken: skip

    def fits(self, run: Claimable) -> bool:
        named = run.required_runner is None or run.required_runner == self.name
        return named and run.labels <= self.labels and run.run_id not in self.declined


class SocketWaiters:
    """The waiting sockets, grouped by their labels, oldest first in each group, and by
    their runner's name (for runs that require one)."""

    def __init__(self) -> None:
        self._groups: dict[frozenset[str], dict[Waiter, None]] = {}
        self._named: dict[str, dict[Waiter, None]] = {}

    def __len__(self) -> int:
        return sum(len(group) for group in self._groups.values())

    def __bool__(self) -> bool:
        return bool(self._groups)

    def add(self, waiter: Waiter) -> None:
        self._groups.setdefault(waiter.labels, {})[waiter] = None
        self._named.setdefault(waiter.name, {})[waiter] = None

    def discard(self, waiter: Waiter) -> None:
        _drop(self._groups, waiter.labels, waiter)
        _drop(self._named, waiter.name, waiter)

    def assign(
        self, claimable: list[Claimable], reserved: set[RunId], complete: bool
    ) -> list[tuple[Waiter, list[RunId] | None]]:
        """Reserve each run of ``claimable`` not in ``reserved`` for the first waiting socket
        it fits (``reserved`` grows); those sockets leave the line and are returned with
        their runs, to be woken. ``complete``: the read holds every claimable run; if not,
        up to ``BLIND_WAKES`` more sockets are returned, with None."""
        chosen: dict[Waiter, list[RunId]] = {}
        for run in claimable:
            if not self._groups:
                break
            if run.run_id in reserved:
                continue
            waiter = self._first_fit(run)
            if waiter is None:
                continue
            reserved.add(run.run_id)
            taken = chosen.setdefault(waiter, [])
            taken.append(run.run_id)
            if len(taken) >= waiter.free:
                self.discard(waiter)
        for waiter in chosen:
            self.discard(waiter)  # one with slots left is woken too: it claims them all
        woken: list[tuple[Waiter, list[RunId] | None]] = list(chosen.items())
        if not complete:
            woken.extend((w, None) for w in self._take_heads(BLIND_WAKES))
        return woken

    def _first_fit(self, run: Claimable) -> Waiter | None:
        if run.required_runner is not None:
            named = self._named.get(run.required_runner, {})
            return next((w for w in named if w.fits(run)), None)
        for labels, group in self._groups.items():
            if not run.labels <= labels:
                continue
            for waiter in group:
                if waiter.fits(run):
                    return waiter
        return None

    def _take_heads(self, count: int) -> list[Waiter]:
        """Up to ``count`` waiters, the oldest of each group in turn."""
        taken: list[Waiter] = []
        while self._groups and len(taken) < count:
            for group in list(self._groups.values()):
                if len(taken) >= count:
                    break
                waiter = next(iter(group))
                self.discard(waiter)
                taken.append(waiter)
        return taken


def _drop(index: dict[K, dict[Waiter, None]], key: K, waiter: Waiter) -> None:
    group = index.get(key)
    if group is not None and group.pop(waiter, False) is None and not group:
        del index[key]


def after_claim(
    reserved: list[RunId] | None, claimed: Sequence[str], declined: frozenset[RunId]
) -> tuple[frozenset[RunId], bool]:
    """What a socket woken with ``reserved`` (None: without a reservation, or not woken
    by a round) keeps from the claim that followed: the runs it declined (not offered to
    it again until it claims something), and whether to notify ``RUNS_AVAILABLE`` (it
    missed runs reserved for it: another round hands them out)."""
    if claimed:
        declined = frozenset()
    if reserved is None:
        return declined, False
    missed = frozenset(reserved).difference(claimed)
    return (declined if claimed else missed), bool(missed)
