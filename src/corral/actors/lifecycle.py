"""An actor's lifecycle as a pure function: ``step(life, event, now) -> Step`` (seed 002).

    create, wake ─▶ pending ──placed()──▶ starting ──Running──▶ running
                     │  ▲  no_capacity()      │                    │
                     │  │  (sleep policy,     │  intent Sleep      │ intent Sleep
                     │  │   no serverless)    ▼                    ▼
                     │  └──── wake ───── sleeping ◀──────────────────  (StopActor sent; it is
                     │     (deferred: will_wake while still placed)      marked sleeping at once)
                     │                        ▲
                     │   intent Stop, GoingAway, destroy: stopping ──┐
                     │                                               ▼
                     └──◀── restart ◀── stopped (backoff) ◀── Stopped(code) | Lost: AFTER_STOP

Every ending of a generation (``Stopped``, ``Lost``) is decided by ``AFTER_STOP``, the one
decision table, first matching row wins (Rivet's ``handle_stopped``). Runner events carry
the runner and generation they are about: one that is not the actor's current placement
is ignored (a fence against late events of an older generation or another runner). The
caller (``store/actors.py``) persists the new ``Life`` and carries out the effects:
``Place`` (try a free slot now: ``placed`` or ``no_capacity`` follows), ``SendStop`` (a
numbered stop_actor command to a runner), ``DropKv``.

Time is passed in; nothing here reads a clock, a database or a socket.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, replace

from corral.errors import IllegalTransition

START_THRESHOLD_S = 30.0  # placed but not running within this: lost
STOP_THRESHOLD_S = 30.0  # told to stop but not stopped within this: lost
RESTART_BASE_S = 2.0  # restart n waits RESTART_BASE_S·2^min(n, RESTART_MAX_EXPONENT)
RESTART_MAX_EXPONENT = 8
RESTART_RESET_S = 600.0  # a generation healthy this long forgets the restarts before it


class ActorState(enum.StrEnum):
    PENDING = "pending"  # wants a runner: being placed, or queued in its pool (no capacity)
    STARTING = "starting"  # placed; StartActor sent; not running yet
    RUNNING = "running"  # its process accepts connections: connectable
    SLEEPING = "sleeping"  # asked to sleep (placed until it stops), or asleep (not placed)
    STOPPING = "stopping"  # placed and told to stop: its stop intent, GoingAway, destroy
    STOPPED = "stopped"  # crashed or lost: placed again at ``reschedule_at`` (backoff)
    DESTROYED = "destroyed"


class CrashPolicy(enum.StrEnum):
    RESTART = "restart"
    SLEEP = "sleep"
    DESTROY = "destroy"


S = ActorState
_ENDINGS = frozenset({S.PENDING, S.STOPPED, S.SLEEPING, S.DESTROYED})  # after Stopped | Lost
TRANSITIONS: dict[ActorState, frozenset[ActorState]] = {
    S.PENDING: frozenset({S.PENDING, S.STARTING, S.SLEEPING, S.DESTROYED}),
    S.STARTING: frozenset({S.RUNNING, S.SLEEPING, S.STOPPING, *_ENDINGS}),
    S.RUNNING: frozenset({S.SLEEPING, S.STOPPING, *_ENDINGS}),
    S.SLEEPING: frozenset({S.STOPPING, *_ENDINGS}),
    S.STOPPING: _ENDINGS,
    S.STOPPED: frozenset({S.PENDING, S.SLEEPING, S.DESTROYED}),
    S.DESTROYED: frozenset(),
}
# Placed in these states, never in the others but SLEEPING (placed until it has stopped).
ALWAYS_PLACED = frozenset({S.STARTING, S.RUNNING, S.STOPPING})
del S


@dataclass(frozen=True)
class Life:
    """What the lifecycle knows of one actor (persisted by the store between events)."""

    state: ActorState
    crash_policy: CrashPolicy
    generation: int = 0  # grows on every placement; 0: never placed
    runner_id: str | None = None  # the placement (None: not placed)
    will_wake: bool = False  # a wake came after the sleep intent, before it stopped
    going_away: bool = False  # its runner drains: the coming end is not its own doing
    destroying: bool = False  # destroy was asked while it was placed
    restarts: int = 0  # restarts in a row (reset after RESTART_RESET_S)
    last_restart_at: float | None = None
    deadline_at: float | None = None  # start or stop threshold: lost if still waiting then
    alarm_at: float | None = None
    started_at: float | None = None
    pending_allocation_at: float | None = None
    connectable_at: float | None = None
    sleep_at: float | None = None
    reschedule_at: float | None = None
    destroyed_at: float | None = None

    @property
    def placed(self) -> bool:
        return self.runner_id is not None

    @property
    def connectable(self) -> bool:
        return self.state is ActorState.RUNNING


def new_life(crash_policy: CrashPolicy, now: float) -> tuple[Life, list[Effect]]:
    """A created actor starts at once: it is pending until placed."""
    return Life(ActorState.PENDING, crash_policy, pending_allocation_at=now), [Place()]


# ---- inputs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Wake:
    pass  # a request wants it (gateway, API, its alarm)


@dataclass(frozen=True)
class Sleep:
    """Intent Sleep: from its process (``runner_id``/``generation`` of that placement) or
    from the API (both None: whatever it is now)."""

    runner_id: str | None = None
    generation: int | None = None


@dataclass(frozen=True)
class Stop:
    runner_id: str  # intent Stop, from its process
    generation: int


@dataclass(frozen=True)
class Running:
    runner_id: str
    generation: int


@dataclass(frozen=True)
class Stopped:
    runner_id: str
    generation: int
    code: int  # the process's exit status; 0 is a graceful exit


@dataclass(frozen=True)
class Lost:
    runner_id: str  # the runner went away, or a start/stop threshold passed
    generation: int


@dataclass(frozen=True)
class GoingAway:
    runner_id: str  # its runner drains
    generation: int


@dataclass(frozen=True)
class SetAlarm:
    runner_id: str
    generation: int
    at: float | None  # None clears it


@dataclass(frozen=True)
class Destroy:
    pass


Event = Wake | Sleep | Stop | Running | Stopped | Lost | GoingAway | SetAlarm | Destroy


# ---- effects ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    pass  # look for a free slot now: the store answers with ``placed`` or ``no_capacity``


@dataclass(frozen=True)
class SendStop:
    runner_id: str
    generation: int


@dataclass(frozen=True)
class DropKv:
    pass


Effect = Place | SendStop | DropKv


@dataclass(frozen=True)
class Step:
    life: Life
    effects: tuple[Effect, ...] = ()


# ---- the decision on the end of a generation (Stopped, Lost) ---------------------------------


class Ending(enum.StrEnum):
    EXITED = "exited"  # exit status 0
    CRASHED = "crashed"  # any other exit status
    LOST = "lost"  # runner gone, or a threshold passed


class After(enum.StrEnum):
    WAKE = "wake"  # place it again now
    SLEEP = "sleep"
    DESTROY = "destroy"
    RESTART = "restart"  # place it again, after the restart backoff if it crashed


def _destroying(life: Life, ending: Ending) -> bool:
    return life.destroying


def _woken_meanwhile(life: Life, ending: Ending) -> bool:
    return life.state is ActorState.SLEEPING and life.will_wake


def _marked_sleeping(life: Life, ending: Ending) -> bool:
    return life.state is ActorState.SLEEPING


def _graceful(life: Life, ending: Ending) -> bool:
    return ending is Ending.EXITED and not life.going_away


def _policy(policy: CrashPolicy) -> Callable[[Life, Ending], bool]:
    return lambda life, _: life.crash_policy is policy


# The decision on every end of a generation, in order: the first row that matches decides.
AFTER_STOP: tuple[tuple[str, Callable[[Life, Ending], bool], After], ...] = (
    ("destroy was asked", _destroying, After.DESTROY),
    ("marked sleeping, woken meanwhile (deferred wake)", _woken_meanwhile, After.WAKE),
    ("marked sleeping", _marked_sleeping, After.SLEEP),
    ("graceful exit (status 0, runner not going away)", _graceful, After.DESTROY),
    ("crash or lost, policy restart", _policy(CrashPolicy.RESTART), After.RESTART),
    ("crash or lost, policy sleep", _policy(CrashPolicy.SLEEP), After.SLEEP),
    ("crash or lost, policy destroy", _policy(CrashPolicy.DESTROY), After.DESTROY),
)


def after_stop(life: Life, ending: Ending) -> After:
    """The first row of ``AFTER_STOP`` that matches."""
    for _, matches, after in AFTER_STOP:
        if matches(life, ending):
            return after
    raise AssertionError(f"no row of AFTER_STOP matches {life.crash_policy}")


def restart_delay(life: Life, now: float) -> tuple[float, int]:
    """(seconds to wait, restarts in a row after this one). ``RESTART_BASE_S·2^min(n, 8)``
    for the n-th restart in a row; the first one after a healthy stretch is immediate."""
    last = life.last_restart_at
    if last is None or now - last >= RESTART_RESET_S:
        return 0.0, 0
    return RESTART_BASE_S * 2.0 ** min(life.restarts, RESTART_MAX_EXPONENT), life.restarts + 1


# ---- the step function -----------------------------------------------------------------------


def _move(life: Life, state: ActorState, **changes: object) -> Life:
    if state not in TRANSITIONS[life.state]:
        raise IllegalTransition(f"an actor cannot go from {life.state} to {state}")
    return replace(life, state=state, **changes)  # type: ignore[arg-type]


def _ignore(life: Life) -> Step:
    return Step(life)


def _current(life: Life, runner_id: str | None, generation: int | None) -> bool:
    """Is an event about the placement the actor has now? (API events name none.)"""
    if runner_id is None and generation is None:
        return True
    return life.placed and life.runner_id == runner_id and life.generation == generation


def step(life: Life, event: Event, now: float) -> Step:
    """What ``event`` does to ``life``; an event that changes nothing returns ``life``."""
    if life.state is ActorState.DESTROYED:
        return _ignore(life)
    if isinstance(event, Wake | Destroy):
        return _wake(life, now) if isinstance(event, Wake) else _destroy(life, now)
    if not _current(life, event.runner_id, event.generation):
        return _ignore(life)  # a late event of another placement
    if isinstance(event, Sleep):
        return _sleep(life, now)
    if isinstance(event, Stop):
        return _stop_intent(life, now)
    if isinstance(event, Running):
        if life.state is not ActorState.STARTING:
            return _ignore(life)
        return Step(
            _move(life, ActorState.RUNNING, connectable_at=now, started_at=now, deadline_at=None)
        )
    if isinstance(event, Stopped):
        return _ended(life, Ending.EXITED if event.code == 0 else Ending.CRASHED, now)
    if isinstance(event, Lost):
        return _ended(life, Ending.LOST, now)
    if isinstance(event, GoingAway):
        return _going_away(life, now)
    return Step(replace(life, alarm_at=event.at))


def _wake(life: Life, now: float) -> Step:
    if life.state is not ActorState.SLEEPING:
        return _ignore(life)  # running, starting or queued already: a stale retry-wake
    if life.placed:
        # Marked sleeping but not stopped yet: wake it once it has (seed 002).
        return _ignore(life) if life.will_wake else Step(replace(life, will_wake=True))
    return _to_pending(life, now)


def _sleep(life: Life, now: float) -> Step:
    if life.state in (ActorState.STARTING, ActorState.RUNNING):
        return _stop(life, ActorState.SLEEPING, now, sleep_at=now)
    if life.state in (ActorState.PENDING, ActorState.STOPPED):  # asked through the API
        return Step(_move(life, ActorState.SLEEPING, sleep_at=now, reschedule_at=None))
    return _ignore(life)  # a second Sleep, or stopping anyway


def _stop_intent(life: Life, now: float) -> Step:
    if life.state in (ActorState.STARTING, ActorState.RUNNING):
        return _stop(life, ActorState.STOPPING, now)
    return _ignore(life)


def _going_away(life: Life, now: float) -> Step:
    if life.going_away:
        return _ignore(life)
    if life.state in (ActorState.STARTING, ActorState.RUNNING):
        return _stop(life, ActorState.STOPPING, now, going_away=True)
    return Step(replace(life, going_away=True))  # told to stop already


def _destroy(life: Life, now: float) -> Step:
    if life.placed:
        assert life.runner_id is not None
        stopping = replace(life, destroying=True)
        if life.state is not ActorState.STOPPING:
            stopping = _move(
                stopping,
                ActorState.STOPPING,
                connectable_at=None,
                deadline_at=now + STOP_THRESHOLD_S,
            )
        return Step(stopping, (SendStop(life.runner_id, life.generation),))
    return Step(
        _move(life, ActorState.DESTROYED, destroyed_at=now, reschedule_at=None), (DropKv(),)
    )


def _stop(life: Life, state: ActorState, now: float, **changes: object) -> Step:
    assert life.runner_id is not None
    stopping = _move(
        life, state, connectable_at=None, deadline_at=now + STOP_THRESHOLD_S, **changes
    )
    return Step(stopping, (SendStop(life.runner_id, life.generation),))


def _ended(life: Life, ending: Ending, now: float) -> Step:
    """The current generation is over: release the placement and apply ``AFTER_STOP``."""
    assert life.runner_id is not None
    # A lost runner may come back with the actor still running: tell it to stop.
    effects: list[Effect] = (
        [SendStop(life.runner_id, life.generation)] if ending is Ending.LOST else []
    )
    after = after_stop(life, ending)
    released = replace(
        life,
        runner_id=None,
        deadline_at=None,
        connectable_at=None,
        will_wake=False,
        going_away=False,
    )
    if after is After.DESTROY:
        destroyed = _move(released, ActorState.DESTROYED, destroyed_at=now, destroying=False)
        return Step(destroyed, (*effects, DropKv()))
    if after is After.SLEEP:
        return Step(
            _move(released, ActorState.SLEEPING, sleep_at=life.sleep_at or now), tuple(effects)
        )
    if after is After.WAKE:
        return _to_pending(released, now, effects)
    if life.going_away:
        # Its runner drained: not a crash of its own. Placed again at once, count reset.
        return _to_pending(replace(released, restarts=0, last_restart_at=now), now, effects)
    if ending is Ending.LOST:
        # Its runner is gone (a generation is lost only once its runner is not alive: see
        # ``due``): not a crash of its own, and a request may be waiting for it — seed 002's
        # lost actor is deallocated and allocated again on the gateway's retry wake, with no
        # backoff. Placed again at once; the crashes counted before stay counted. An actor
        # that takes its runner down is lost again only a runner-lost threshold later.
        return _to_pending(released, now, effects)
    delay, restarts = restart_delay(life, now)
    released = replace(released, restarts=restarts, last_restart_at=now)
    if delay == 0:
        return _to_pending(released, now, effects)
    stopped = _move(released, ActorState.STOPPED, reschedule_at=now + delay)
    return Step(stopped, tuple(effects))


def _to_pending(life: Life, now: float, effects: list[Effect] | None = None) -> Step:
    pending = _move(
        life,
        ActorState.PENDING,
        pending_allocation_at=now,
        sleep_at=None,
        reschedule_at=None,
        will_wake=False,
    )
    return Step(pending, (*(effects or ()), Place()))


# ---- the store's answers to Place ------------------------------------------------------------


def placed(life: Life, runner_id: str, now: float) -> Life:
    """A free slot was taken on ``runner_id``: the next generation starts there."""
    return _move(
        life,
        ActorState.STARTING,
        runner_id=runner_id,
        generation=life.generation + 1,
        deadline_at=now + START_THRESHOLD_S,
        pending_allocation_at=None,
    )


def no_capacity(life: Life, serverless: bool, now: float) -> Life:
    """No free slot: wait in the pool's queue — except an actor of the sleep policy in a
    pool no serverless endpoint can grow, which sleeps until it is woken again."""
    if life.state is not ActorState.PENDING:
        raise IllegalTransition(f"only a pending actor waits for capacity, not a {life.state} one")
    if life.crash_policy is CrashPolicy.SLEEP and not serverless:
        return _move(life, ActorState.SLEEPING, sleep_at=now, pending_allocation_at=None)
    return life  # stays pending, queued


# ---- timers ----------------------------------------------------------------------------------


def next_deadline(life: Life) -> float | None:
    """When ``due`` has something to do for this actor."""
    times = [life.deadline_at if life.placed else None, life.alarm_at]
    if life.state is ActorState.STOPPED:
        times.append(life.reschedule_at)
    return min((t for t in times if t is not None), default=None)


def due(life: Life, now: float, *, runner_alive: bool = False) -> Step:
    """What the passing of time does: a start or stop threshold passed (lost), a restart's
    backoff ended (placed again), an alarm rang (woken).

    A threshold that passes while the actor's runner is alive (``runner_alive``: active or
    draining, not lost) only starts another wait: the process may still be there — the
    runner counts its own thresholds from when the command reached it, then SIGTERM, then
    SIGKILL — and placed elsewhere now, the actor would have two live generations. The
    runner says when it has stopped (or it is lost, and has stopped its work by then)."""
    if life.state is ActorState.DESTROYED:
        return _ignore(life)
    if life.placed and life.deadline_at is not None and now >= life.deadline_at:
        assert life.runner_id is not None
        if runner_alive:
            wait = START_THRESHOLD_S if life.state is ActorState.STARTING else STOP_THRESHOLD_S
            return Step(replace(life, deadline_at=now + wait))
        return step(life, Lost(life.runner_id, life.generation), now)
    if (
        life.state is ActorState.STOPPED
        and life.reschedule_at is not None
        and now >= life.reschedule_at
    ):
        return _to_pending(life, now)
    if life.alarm_at is not None and now >= life.alarm_at:
        woken = step(replace(life, alarm_at=None), Wake(), now)
        return Step(woken.life, woken.effects)
    return _ignore(life)
