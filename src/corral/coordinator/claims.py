"""Which waiting long-poll may try a claim: the claimable runs, read once per round and
shared by every poll, so that waiting costs no database write.

A claim is a write transaction. A long-poll used to try one when it arrived and every
time it was woken, so 2,000 waiting runners woken by one new run (or by the reconciler,
each second, while a run no runner can take was pending) queued 2,000 write transactions
in front of every other request. Now:

    round ──▶ one read (``RunStore.claimable``: ready pending runs, what each requires)
          ──▶ each woken poll matches its runner against them in memory and *reserves*
              the runs it could take that no other poll of this round has reserved
          ──▶ only a poll holding a reservation claims (writes)

A round is one ``RUNS_AVAILABLE`` event of the notifier: it ends when runs become
available (created, requeued, the reconciler's wake-up) — or when a claim did not take
what was reserved (another coordinator took it, or a run earlier in the queue came
first): then the poll notifies, and every waiting poll looks again at a fresh read, so
no run is left waiting behind a reservation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from corral.ids import RunId
from corral.runners import Runner
from corral.store.claims import Claimable

# Runs read per round. Beyond them the read may miss what a runner could take: a poll that
# reserves nothing from an incomplete read claims anyway (a busy queue: claims succeed).
READ_LIMIT = 1000


@dataclass
class _Round:
    event: asyncio.Event  # the notifier's RUNS_AVAILABLE event of this round
    read: asyncio.Task[list[Claimable]]
    reserved: set[RunId]


class ClaimBoard:
    def __init__(self, read: Callable[[int], Awaitable[list[Claimable]]]) -> None:
        self._read = read  # ``RunStore.claimable`` with the time, off the event loop
        self._round: _Round | None = None

    async def reserve(
        self, runner: Runner, max_runs: int, event: asyncio.Event
    ) -> list[RunId] | None:
        """Up to ``max_runs`` runs ``runner`` may go and claim in the round of ``event``,
        reserved for it; ``[]``: nothing for it, wait. ``None``: the read was incomplete
        and has nothing for it: claim without a reservation."""
        claimable, reserved = await self.look(event)
        mine = [c.run_id for c in claimable if c.run_id not in reserved and c.fits(runner)][
            :max_runs
        ]
        reserved.update(mine)
        if not mine and len(claimable) >= READ_LIMIT:
            return None
        return mine

    async def look(self, event: asyncio.Event) -> tuple[list[Claimable], set[RunId]]:
        """The claimable runs of the round of ``event`` (read once for all who look), and
        those reserved in it so far: what the caller reserves, it adds there. The socket
        waiters' rounds (``coordinator.waiters``) share them with the long-polls."""
        current = self._round
        if current is None or current.event is not event or current.read.cancelled():
            read = asyncio.ensure_future(self._read(READ_LIMIT))
            current = self._round = _Round(event, read, set())
        try:
            claimable = await asyncio.shield(current.read)
        except Exception:
            if self._round is current:
                self._round = None  # the next poll reads again
            raise
        return claimable, current.reserved
