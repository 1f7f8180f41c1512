"""Actors on the coordinator: the store's actor operations off the event loop, and who to
wake after them. This is also the interface the gateway uses:

    event = actors.changed(actor_id)     # take it *before* looking (notifier.py's rule)
    actor = await actors.get(actor_id)   # actor.placement: (runner, generation) once
                                         # connectable, else None
    await actors.wake(actor_id)          # sleeping → placed (or deferred: will_wake)
    await wait_for(event, timeout)       # set on every change of its state

``resolve(actor_id)`` is the short form of get + placement. Every change of an actor sets
``changed(actor_id)`` — whichever coordinator path made it (API, runner events, timers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import anyio.to_thread

from corral.actors import lifecycle as lc
from corral.actors.model import Actor, NewActor, Placement
from corral.actors.wire import ActorEventBase
from corral.clock import Clock
from corral.coordinator.notifier import Notifier, actor_topic, runner_topic
from corral.protocol.messages import ToServerInit
from corral.store import Store
from corral.store.actors import Changes

T = TypeVar("T")
log = logging.getLogger("corral.coordinator")


class Actors:
    def __init__(self, store: Store, notifier: Notifier, clock: Clock) -> None:
        self.store = store
        self.notifier = notifier
        self.clock = clock

    async def in_thread(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))

    def notify(self, changes: Changes) -> None:
        """Wake followers of the actors that changed, and the push loops of the runners
        that got commands."""
        self.notifier.notify(
            *(actor_topic(a) for a in changes.actors), *(runner_topic(r) for r in changes.runners)
        )

    # ---- the gateway's interface ---------------------------------------------------------

    def changed(self, actor_id: str) -> asyncio.Event:
        """Set at the next change of the actor; take it before reading the actor."""
        return self.notifier.event(actor_topic(actor_id))

    async def resolve(self, actor_id: str) -> Placement | None:
        """(runner, generation) to reach the actor at, once it is connectable; else None.
        Raises ``NotFound`` (actor_not_found) for an unknown actor."""
        return (await self.get(actor_id)).placement

    async def wake(self, actor_id: str) -> Actor:
        return await self._signal(actor_id, lc.Wake())

    # ---- the API -------------------------------------------------------------------------

    async def create(self, spec: NewActor) -> tuple[Actor, bool]:
        actor, created, changes = await self.in_thread(
            self.store.actors.create, spec, self.clock.now()
        )
        self.notify(changes)
        return actor, created

    async def known(self, name: str, pool: str) -> bool:
        return await self.in_thread(self.store.actors.known, name, pool)

    async def get(self, actor_id: str) -> Actor:
        return await self.in_thread(self.store.actors.get, actor_id)

    async def list(self, **filters: Any) -> list[Actor]:
        return await self.in_thread(partial(self.store.actors.list, **filters))

    async def sleep(self, actor_id: str) -> Actor:
        return await self._signal(actor_id, lc.Sleep())

    async def destroy(self, actor_id: str) -> Actor:
        return await self._signal(actor_id, lc.Destroy())

    async def _signal(self, actor_id: str, event: lc.Event) -> Actor:
        actor, changes = await self.in_thread(
            self.store.actors.signal, actor_id, event, self.clock.now()
        )
        self.notify(changes)
        return actor

    # ---- timers and runners --------------------------------------------------------------

    async def tick(self) -> None:
        """Thresholds, backoffs, alarms; drained and lost runners' actors; queues served.
        A failure is logged, not raised: the runs' reconciliation that follows must go on."""
        try:
            self.notify(await self.in_thread(self.store.actors.tick, self.clock.now()))
        except Exception:
            log.exception("actors: tick failed; trying again at the next one")


def host_and_serve(store: Store, runner_id: str, init: ToServerInit, now: float) -> Changes:
    """A runner connected: record what actors it hosts and fill its free slots from the
    pool's queue (the start commands go out with the commands it has missed)."""
    store.actors.host(runner_id, init.pool, init.actor_names, init.actor_slots)
    if not init.actor_names or not init.actor_slots:
        return Changes()
    return store.actors.serve(init.pool, now)


def kv_request(
    store: Store,
    runner_id: str,
    actor_id: str,
    op: dict[str, Any],
    now: float,
    *,
    generation: int | None = None,
) -> dict[str, Any]:
    """An actor's KV operation, accepted only from the runner it is placed on, and from the
    generation placed there when the runner names it: a runner that lost the actor (or
    never had it), or an older generation's process still ending beside the new one, must
    not write over its new placement."""
    if not store.actors.placed_on(actor_id, runner_id, generation):
        which = "" if generation is None else f" (generation {generation})"
        return {
            "ok": False,
            "code": "actor_not_placed",
            "error": f"actor {actor_id}{which} is not placed on runner {runner_id}",
        }
    return store.kv.apply(actor_id, op, now)


def actor_wakeups(events: Sequence[object], changed: Changes) -> list[str]:
    """Topics to wake after a runner's actor events were applied: the followers of the
    actors they name or changed, and the push loops of the runners that got commands
    (``changed``, what the store did: a stop after an intent, or a start where a stop
    placed an actor — a queued one in the slot it freed, or itself again, maybe on
    another runner, whose push loop nothing else wakes). A report that an actor runs
    makes no command: it wakes no push loop."""
    named = [e.actor_id for e in events if isinstance(e, ActorEventBase)]
    actors = dict.fromkeys([*named, *sorted(changed.actors)])
    return [
        *(actor_topic(a) for a in actors),
        *(runner_topic(r) for r in sorted(changed.runners)),
    ]
