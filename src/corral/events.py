"""Events: what changed in the store, in the order it committed, for ``GET /events``.

Every state change of a run, session, task, plan (a task plan's project), runner, actor or
pool, and every log line, becomes one event, written by the database in the transaction of the
change (triggers: ``corral.store.events``) — no event without its change, no change
without its event, whoever wrote it (a coordinator, ``corral gc``, another process).

An event as the stream sends it (``GET /events``, server-sent events)::

    id: 1042
    event: run
    data: {"id": 1042, "kind": "run", "at": 1764142351.5, "run_id": "run_…",
    data:  "session_id": null, "session_name": null, "plan_id": null, "runner_id": "rnr_…",
    data:  "actor_id": null, "pool": null, "data": {"status": "claimed", "attempts": 1, …}}

(one ``data:`` line, broken here to fit). ``id`` grows by one or more with each event;
``at`` is the change's time (seconds since the epoch). ``data`` by kind:

    run      type, status, attempts, max_attempts, exit_code, error, cost_usd,
             cancel_requested, task_id          (created, each status, a cancel asked)
    log      attempt, line_no, stream, text, ts (each line a runner sent)
    session  name, runs, cost_usd, is_error, last_run_id   (created, each run it ended)
    task     key, title, status, attempts, run_id, commit_sha, merge_sha, last_error,
             cost_usd, steps (the names of the attempt's steps done, in order)
                                                (created, each status, attempt or step)
    plan     repo_path, target_branch, paused, pause_reason, cost_usd, budget_usd,
             workers                            (created, paused/resumed, cost, workers)
    runner   name, state, transport, slots      (registered, each state)
    actor    name, key, state, generation, will_wake, going_away, destroying, restarts,
             placed (1 placed on ``runner_id``, 0 not)   (created, each state, generation
             or intent, each placement on a runner and each release of one)
    pool     serverless (its settings, or null), wanted_slots, desired_runners
                               (its settings put; its autoscaler's demand changed: the
                               slots its actors want, the runners that makes)
             error_kind, error (an error of its autoscaler recorded)

Filters (query parameters of ``GET /events``, all optional, combined with AND): ``kind``
(comma-separated kinds), ``run_id``, ``session`` (a session's id or name), ``plan`` (a
plan's project id), ``runner``, ``actor`` (an actor id), ``pool``. A run's events carry its
session, plan and runner; a log line's carry its run's; an actor's its pool and runner.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from corral.errors import InvalidRequest


class EventKind(enum.StrEnum):
    RUN = "run"
    LOG = "log"
    SESSION = "session"
    TASK = "task"
    PLAN = "plan"
    RUNNER = "runner"
    ACTOR = "actor"
    POOL = "pool"


class Event(NamedTuple):
    """An event as the log holds it: what a filter reads, and ``sse``, the whole
    server-sent event (``id:``, ``event:``, ``data:`` and the blank line), made by the
    database as it reads the row (``corral.store.events``). The pump sends an event to
    fifty streams without building, parsing or encoding it in Python: that was ~5 µs of
    the coordinator's CPU an event, four events a run."""

    id: int
    kind: str  # an EventKind's value
    run_id: str | None
    session_id: str | None
    session_name: str | None
    plan_id: str | None
    runner_id: str | None
    actor_id: str | None
    pool: str | None
    sse: str

    def to_json(self) -> dict[str, Any]:
        """The event as its ``data:`` line says it (parsed on each call)."""
        found: dict[str, Any] = json.loads(self.sse.split("\ndata: ", 1)[1])
        return found

    @property
    def data(self) -> dict[str, Any]:
        found: dict[str, Any] = self.to_json()["data"]
        return found

    @property
    def at(self) -> float:
        return float(self.to_json()["at"])


class EventText(NamedTuple):
    """Events one filter wants, as the stream sends them: how many, the first and the last
    id (0 if none), and their server-sent texts one after the other."""

    size: int
    first: int
    last: int
    sse: str


def encoded(events: Iterable[Event]) -> bytes:
    """Events as the stream sends them, one after the other."""
    return "".join([event.sse for event in events]).encode()


@dataclass(frozen=True)
class EventFilter:
    """Which events a subscriber wants; the empty filter wants them all."""

    kinds: frozenset[EventKind] = frozenset()
    run_id: str | None = None
    session: str | None = None  # a session id or name
    plan: str | None = None
    runner: str | None = None
    actor: str | None = None
    pool: str | None = None

    def __hash__(self) -> int:
        # Hashed twice a stream each round of the pump (``EventHub._fan_out``): once here.
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            fields = (self.kinds, self.run_id, self.session, self.plan, self.runner)
            cached = self.__dict__["_hash"] = hash((*fields, self.actor, self.pool))
        return cached

    @classmethod
    def parse(
        cls,
        kind: str | None = None,
        run_id: str | None = None,
        session: str | None = None,
        plan: str | None = None,
        runner: str | None = None,
        actor: str | None = None,
        pool: str | None = None,
    ) -> EventFilter:
        """From the query parameters; an unknown kind is refused (``invalid_request``)."""
        kinds = set()
        for name in (kind or "").split(","):
            name = name.strip()
            if not name:
                continue
            try:
                kinds.add(EventKind(name))
            except ValueError:
                known = ", ".join(k.value for k in EventKind)
                raise InvalidRequest(f"kind {name!r} is not an event kind ({known})") from None
        return cls(
            frozenset(kinds),
            run_id or None,
            session or None,
            plan or None,
            runner or None,
            actor or None,
            pool or None,
        )

    def matches(self, event: Event) -> bool:
        """The same test as ``sql`` makes in the store, for events fanned out live."""
        return (
            (not self.kinds or event.kind in self.kinds)
            and (self.run_id is None or event.run_id == self.run_id)
            and (self.session is None or self.session in (event.session_id, event.session_name))
            and (self.plan is None or event.plan_id == self.plan)
            and (self.runner is None or event.runner_id == self.runner)
            and (self.actor is None or event.actor_id == self.actor)
            and (self.pool is None or event.pool == self.pool)
        )

    def sql(self) -> tuple[str, list[Any]]:
        """A condition on the events table (``AND`` …, possibly empty) and its parameters."""
        clauses, params = [], []
        if self.kinds:
            clauses.append(f"e.kind IN ({', '.join('?' for _ in self.kinds)})")
            params += sorted(k.value for k in self.kinds)
        for column, value in (
            ("run_id", self.run_id),
            ("plan_id", self.plan),
            ("actor_id", self.actor),
            ("pool", self.pool),
        ):
            if value is not None:
                clauses.append(f"e.{column} = ?")
                params.append(value)
        if self.runner is not None:
            clauses.append("e.runner_id = ?")
            params.append(self.runner)
        if self.session is not None:
            clauses.append("(e.session_id = ? OR e.session_name = ?)")
            params += [self.session, self.session]
        return "".join(f" AND {c}" for c in clauses), params


def sse_message(name: str, body: Mapping[str, Any], *, event_id: int) -> bytes:
    """A message of the stream itself (``ready``, ``dropped``); its ``id:`` is the position
    of the stream (the last event sent), so a client resuming from it misses nothing."""
    data = json.dumps(dict(body), separators=(",", ":"))
    return f"id: {event_id}\nevent: {name}\ndata: {data}\n\n".encode()


KEEPALIVE = b": keepalive\n\n"  # a comment line: clients ignore it, proxies see traffic
