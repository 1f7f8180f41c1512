"""The event log: reading it back in order, numbering it, and letting old events go.

Events are written by the database itself: a trigger on each table whose changes are
events (``event_triggers``) inserts one row into ``events`` in the transaction of
the change, whichever code made it. What a row carries is in ``corral.events``.

Ids in commit order
-------------------
A reader resumes "after id N": it must never later find a committed event with an id
of N or less. On SQLite every writer holds the database's single write lock from BEGIN
IMMEDIATE to COMMIT, so ids taken inside a transaction are in commit order already: the
trigger's AUTOINCREMENT id is the event's id (never reused, even once deleted).

On PostgreSQL, transactions commit concurrently and a sequence value taken early may
commit late: a reader could see 12, resume after it, and miss 11 committed a moment
later. Serializing the writers (an advisory lock or a counter row held until commit)
would make every state-changing transaction wait for the previous one's commit and
fsync, and taking that lock mid-transaction can deadlock against row locks. So there the
trigger writes the row without a public id (``seq`` only keeps the order of writing) and
queues it (``event_queue``); ``number`` gives ids afterwards, in one short transaction
under an advisory lock: it takes the queued rows committed so far (later ones are
invisible to it) and gives them ids one after the other from a counter, in
``event_ids``. Numberings are serialized and each commits whole, so what a reader sees is
always a prefix of the ids: none is skipped, none appears behind one already read. The
coordinator numbers before each read of the log. Readers read ``numbered_events``: the
numbered events (on SQLite, every event).
"""

from __future__ import annotations

from collections.abc import Collection
from itertools import takewhile

from corral.errors import Gone, InvalidRequest
from corral.events import Event, EventFilter, EventText
from corral.store.db import Database, Tx

NUMBERING_LOCK = 4242013  # pg_advisory_xact_lock key of ``number`` (migrate uses 4242001)
IDS = {"sqlite": "events", "postgres": "event_ids"}  # the table that holds the ids given


class EventStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    @property
    def numbered_later(self) -> bool:
        """Whether ``number`` has work to do here (PostgreSQL) or none (SQLite)."""
        return self.db.dialect != "sqlite"

    def number(self) -> int:
        """PostgreSQL: give ids to the events committed without one (see the module's
        docstring); how many. SQLite: nothing to do (ids are given on insert)."""
        if self.db.dialect == "sqlite":
            return 0
        with self.db.transaction() as tx:
            return self._number(tx)

    def _number(self, tx: Tx) -> int:
        if tx.one("SELECT 1 AS x FROM event_queue LIMIT 1") is None:
            return 0  # the usual case when idle: no lock, nothing written
        tx.execute("SELECT pg_advisory_xact_lock(?)", (NUMBERING_LOCK,))
        # A statement's snapshot is taken after the lock: it sees the previous numbering.
        row = tx.one(
            "WITH queued AS (DELETE FROM event_queue RETURNING seq), "
            "counter AS (UPDATE event_log SET last_id = last_id + "
            "(SELECT COUNT(*) FROM queued) RETURNING last_id), "
            "numbered AS (INSERT INTO event_ids (id, seq) "
            "SELECT counter.last_id - (SELECT COUNT(*) FROM queued) "
            "+ ROW_NUMBER() OVER (ORDER BY q.seq), q.seq FROM queued q, counter RETURNING 1) "
            "SELECT COUNT(*) AS n FROM numbered"
        )
        return int(row["n"]) if row else 0

    def read_round(
        self, after: int, filters: Collection[EventFilter], limit: int
    ) -> tuple[int, int, dict[EventFilter, EventText]]:
        """The event pump's round, in one transaction (numbering first on PostgreSQL): the
        id up to which it reads (up to ``limit`` events after ``after``; ``after`` if none
        came), how many events that is, and for each filter the text of the events it wants
        among them (``read_texts``)."""
        if self.db.dialect == "sqlite":
            with self.db.transaction(write=False) as tx:
                return self._read_round(tx, after, filters, limit)
        with self.db.transaction() as tx:
            self._number(tx)
            return self._read_round(tx, after, filters, limit)

    def read_texts(
        self, after: int, until: int, filters: Collection[EventFilter]
    ) -> dict[EventFilter, EventText]:
        """For each filter, the text of the numbered events in (``after``, ``until``] it
        wants: one statement a filter, whose aggregate is made inside the database (one
        string, not a row and its values an event)."""
        with self.db.transaction(write=False) as tx:
            return self._read_texts(tx, after, until, filters)

    def _read_round(
        self, tx: Tx, after: int, filters: Collection[EventFilter], limit: int
    ) -> tuple[int, int, dict[EventFilter, EventText]]:
        until, count = tx.tuples(
            "SELECT MAX(p.id), COUNT(*) FROM (SELECT id FROM numbered_events WHERE id > ? "
            "ORDER BY id LIMIT ?) p",
            (after, limit),
        )[0]
        if not count:
            return after, 0, {}
        return until, count, self._read_texts(tx, after, until, filters)

    def _read_texts(
        self, tx: Tx, after: int, until: int, filters: Collection[EventFilter]
    ) -> dict[EventFilter, EventText]:
        texts = {}
        for where in filters:
            condition, params = where.sql()
            statement = _texts(self.db.dialect, condition)
            count, first, last, text = tx.tuples(statement, (after, until, *params))[0]
            texts[where] = EventText(count, first or 0, last or 0, text or "")
        return texts

    def read(self, after: int, where: EventFilter, limit: int = 500) -> list[Event]:
        """The events after id ``after`` that ``where`` wants, oldest first (numbered ones:
        call ``number`` first on PostgreSQL)."""
        with self.db.transaction(write=False) as tx:
            return self._read(tx, after, where, limit)

    def _read(self, tx: Tx, after: int, where: EventFilter, limit: int) -> list[Event]:
        condition, params = where.sql()
        rows = tx.tuples(
            "SELECT e.id, e.kind, e.run_id, e.session_id, e.session_name, e.plan_id, "
            f"e.runner_id, e.actor_id, e.pool, {_SSE[self.db.dialect]} {_FROM} "
            f"WHERE e.id > ?{condition} ORDER BY e.id LIMIT ?",
            (after, *params, limit),
        )
        return [_new_event(Event, row) for row in rows]

    def latest(self) -> int:
        """The newest id given (0: none yet); a resume after it waits for the next."""
        with self.db.transaction(write=False) as tx:
            row = tx.one(
                "SELECT MAX(e.id) AS top, MAX(l.last_id) AS counted, MAX(l.deleted_through) "
                f"AS gone FROM event_log l LEFT JOIN {IDS[self.db.dialect]} e ON 1 = 1"
            )
        assert row is not None
        return max(int(row[k] or 0) for k in ("top", "counted", "gone"))

    def check_resume(self, after: int) -> int:
        """``after`` if the events after it are all still here; ``events_expired`` (410)
        if retention deleted some, ``unknown_event_id`` (400) if no such id was given."""
        with self.db.transaction(write=False) as tx:
            row = tx.one("SELECT deleted_through FROM event_log")
        gone = int(row["deleted_through"]) if row else 0
        if after < gone:
            raise Gone(
                f"events after {after} up to {gone} were deleted by retention: "
                "start again without Last-Event-ID (or after the newest)",
                code="events_expired",
                deleted_through=gone,
            )
        if after > self.latest():
            raise InvalidRequest(
                f"no event has id {after} here (it comes from another coordinator's "
                "database, or was made up)",
                code="unknown_event_id",
            )
        return after

    def session_known(self, key: str) -> bool:
        """A session with this id or name exists, or a run names it (a new session)."""
        with self.db.transaction(write=False) as tx:
            return (
                tx.one("SELECT 1 AS x FROM sessions WHERE id = ? OR name = ? LIMIT 1", (key, key))
                or tx.one(
                    "SELECT 1 AS x FROM runs WHERE session_id = ? OR session_name = ? LIMIT 1",
                    (key, key),
                )
            ) is not None

    def collect(self, cutoff: float, batch: int) -> int:
        """Retention: delete the oldest events, in id order, while they are older than
        ``cutoff`` (``at``), in batches; remember the highest id deleted, so that a resume
        from before it is refused. (On PostgreSQL events nobody read yet have no id: they
        are numbered first.) ``at`` is the change's time, nearly in id order: an event a
        little older than ``cutoff`` behind a newer one waits for a later pass. No index on
        ``at``: each event would write one more entry (~2 µs of the coordinator's CPU an
        event on SQLite, four events a run) for a pass an hour."""
        self.number()
        deleted = 0
        while True:
            with self.db.transaction() as tx:
                rows = tx.execute(
                    "SELECT id, at FROM numbered_events ORDER BY id LIMIT ?", (batch,)
                )
                old = list(takewhile(lambda row: row["at"] < cutoff, rows))
                if not old:
                    return deleted
                top = int(old[-1]["id"])
                if self.db.dialect == "sqlite":
                    tx.execute("DELETE FROM events WHERE id <= ?", (top,))
                else:
                    tx.execute(
                        "DELETE FROM events e USING event_ids i WHERE e.seq = i.seq AND i.id <= ?",
                        (top,),
                    )
                    tx.execute("DELETE FROM event_ids WHERE id <= ?", (top,))
                tx.execute(
                    "UPDATE event_log SET deleted_through = ? WHERE deleted_through < ?",
                    (top, top),
                )
                deleted += len(old)


_FROM = "FROM numbered_events e LEFT JOIN run_logs l ON e.ref = l.id AND e.kind = 'log'"


FIELDS = ("run_id", "session_id", "session_name", "plan_id", "runner_id", "actor_id", "pool")


def _sse(dialect: str) -> str:
    """The SQL of an event's server-sent text, from ``numbered_events e`` and its log
    line ``l``: ``Event.to_json``'s keys in order, strings and the time as JSON (the time
    exact: 17 significant digits on SQLite, the shortest exact form on PostgreSQL), and a
    log line's ``text`` added at the end of its ``data`` (always an object with keys)."""
    # PostgreSQL: to_json of NULL is NULL; nothing there may hold '?' or '%' (_PostgresTx).
    string = "json_quote({})" if dialect == "sqlite" else "COALESCE(to_json({})::text, 'null')"
    data = (
        "CASE WHEN e.kind = 'log' THEN substr(e.data, 1, length(e.data) - 1) || "
        f"""',"text":' || {string.format("l.text")} || '}}' ELSE e.data END"""
    )
    if dialect == "sqlite":
        # One printf, not a chain of || (each of which makes a new string): ~25 % less.
        keys = "".join(f',"{name}":%s' for name in FIELDS)
        text = f'id: %d\nevent: %s\ndata: {{"id":%d,"kind":"%s","at":%!.17g{keys},"data":%s}}\n\n'
        values = ["e.id", "e.kind", "e.id", "e.kind", "e.at"]
        values += [string.format(f"e.{name}") for name in FIELDS] + [data]
        return f"printf('{text}', {', '.join(values)})"
    parts = [
        "'id: ' || e.id || chr(10) || 'event: ' || e.kind || chr(10)",
        """'data: {"id":' || e.id || ',"kind":"' || e.kind || '"'""",
        """',"at":' || to_json(e.at)::text""",
        *(f"""',"{name}":' || {string.format("e." + name)}""" for name in FIELDS),
        f"""',"data":' || {data}""",
        "'}' || chr(10) || chr(10)",
    ]
    return " || ".join(parts)


_SSE = {dialect: _sse(dialect) for dialect in ("sqlite", "postgres")}


def _texts(dialect: str, condition: str) -> str:
    """The statement of ``read_texts`` for one filter's ``condition``: the events' texts
    joined in id order. (SQLite's group_concat joins in the order its rows come, and a
    subquery with ORDER BY under an aggregate is not flattened into it: it runs first, in
    order. PostgreSQL is told the order.)"""
    joined = (
        "group_concat(p.sse, '')" if dialect == "sqlite" else "string_agg(p.sse, '' ORDER BY p.id)"
    )
    return (
        f"SELECT COUNT(*), MIN(p.id), MAX(p.id), {joined} FROM (SELECT e.id, {_SSE[dialect]} "
        f"AS sse {_FROM} WHERE e.id > ? AND e.id <= ?{condition} ORDER BY e.id) p"
    )


# A row as it comes is an Event's fields in order: made into one without a call to
# NamedTuple's ``__new__`` (or ``_make``), which would copy it again.
_new_event = tuple.__new__
