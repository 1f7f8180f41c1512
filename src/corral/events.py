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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any

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


class StoredData(Mapping[str, Any]):
    """An event's ``data`` as the store keeps it, JSON text, parsed only if read: the
    stream sends the text as it is (``Event.encoded``), so an event on its way from the log
    to fifty streams is never parsed and made again. ``extra``: keys kept elsewhere (a log
    line's ``text``, read from its own table), added to the object."""

    __slots__ = ("_decoded", "extra", "json")

    def __init__(self, json_text: str, extra: Mapping[str, Any] | None = None) -> None:
        self.json = json_text
        self.extra = extra
        self._decoded: dict[str, Any] | None = None

    def _data(self) -> dict[str, Any]:
        if self._decoded is None:
            decoded = json.loads(self.json)
            decoded.update(self.extra or {})
            self._decoded = decoded
        return self._decoded

    def __getitem__(self, key: str) -> Any:
        return self._data()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data())

    def __len__(self) -> int:
        return len(self._data())

    def encoded(self) -> str:
        """As JSON: the stored text, not parsed (the extra keys added at its end)."""
        if not self.extra:
            return self.json
        body = self.json.rstrip()
        if not body.endswith("}") or body[:-1].strip() in ("{", ""):
            return json.dumps(self._data(), separators=(",", ":"))  # not an object with keys
        added = ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in self.extra.items())
        return f"{body[:-1]},{added}}}"


@dataclass(frozen=True)
class Event:
    id: int
    kind: EventKind
    at: float
    run_id: str | None
    session_id: str | None
    session_name: str | None
    plan_id: str | None
    runner_id: str | None
    data: Mapping[str, Any]
    actor_id: str | None = None
    pool: str | None = None

    @property
    def encoded(self) -> bytes:
        """As ``sse`` sends it: encoded once, however many streams send it."""
        # Kept in the instance's dict by hand: ``functools.cached_property`` takes a lock on
        # each read up to Python 3.12, ~1 µs an event in the pump.
        cached: bytes | None = self.__dict__.get("_encoded")
        if cached is None:
            cached = self.__dict__["_encoded"] = self._encode()
        return cached

    def _encode(self) -> bytes:
        kind = self.kind.value
        if isinstance(self.data, StoredData):  # by hand: the same JSON as below, faster
            body = (
                f'{{"id":{self.id},"kind":"{kind}","at":{self.at!r},'
                f'"run_id":{_string(self.run_id)},"session_id":{_string(self.session_id)},'
                f'"session_name":{_string(self.session_name)},'
                f'"plan_id":{_string(self.plan_id)},"runner_id":{_string(self.runner_id)},'
                f'"actor_id":{_string(self.actor_id)},"pool":{_string(self.pool)},'
                f'"data":{self.data.encoded()}}}'
            )
        else:
            body = json.dumps(self.to_json(), separators=(",", ":"))
        return f"id: {self.id}\nevent: {kind}\ndata: {body}\n\n".encode()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "at": self.at,
            "run_id": self.run_id,
            "session_id": self.session_id,
            "session_name": self.session_name,
            "plan_id": self.plan_id,
            "runner_id": self.runner_id,
            "actor_id": self.actor_id,
            "pool": self.pool,
            "data": dict(self.data),
        }


def _string(value: str | None) -> str:
    # What json.dumps makes of a string (ensure_ascii), without its way through JSONEncoder:
    # an event encodes up to seven of them.
    return "null" if value is None else encode_basestring_ascii(value)


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


def sse(event: Event) -> bytes:
    """One server-sent event: ``id:``, ``event:`` (the kind), ``data:`` (the JSON)."""
    return event.encoded


def sse_message(name: str, body: Mapping[str, Any], *, event_id: int) -> bytes:
    """A message of the stream itself (``ready``, ``dropped``); its ``id:`` is the position
    of the stream (the last event sent), so a client resuming from it misses nothing."""
    data = json.dumps(dict(body), separators=(",", ":"))
    return f"id: {event_id}\nevent: {name}\ndata: {data}\n\n".encode()


KEEPALIVE = b": keepalive\n\n"  # a comment line: clients ignore it, proxies see traffic
