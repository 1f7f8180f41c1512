"""The event log's table and the triggers that write it: one per table whose changes are
events, generated for each dialect from ``Source`` lists (see ``corral.store.events``).

A migration is never rewritten once released: migration 7 is made from ``SOURCES`` as it
was, and migration 11 from ``ACTOR_SOURCES`` (actors, their placements, pools and pool
errors, which came later) and ``TASK_STEPS`` (the tasks' triggers again, now also for a
step done). Each source lists the key columns it fills, so the rows older triggers write
leave the columns added later (``actor_id``, ``pool``) NULL. On PostgreSQL, migration 22
makes the latest sources' triggers again, once a statement instead of once a row."""

from __future__ import annotations

from dataclasses import dataclass, replace

from corral.events import EventKind


@dataclass(frozen=True)
class Source:
    """A table whose rows' changes are events of ``kind``: columns of the events row as SQL
    over ``NEW`` (``None``: NULL), what ``data`` holds, and the columns whose change is one."""

    table: str
    kind: EventKind
    at: str
    keys: dict[str, str | None]  # run_id, session_id, session_name, plan_id, runner_id, ref
    # (and, from migration 11, actor_id and pool)
    data: tuple[str, ...]  # columns of NEW by name, or ``name=SQL`` (``{snippets}`` filled)
    watched: tuple[str, ...]  # an UPDATE changing none of these is no event
    from_run: bool = False  # keys are read from the run row ``r`` the line belongs to
    when_inserted: str | None = None  # a condition on NEW for an INSERT to be an event
    joined: str | None = None  # ``FROM …`` a row the values read (besides NEW or OLD)
    on_delete: bool = False  # a DELETE is an event too (its values read OLD, not NEW)


_PLAN_OF_TASK = "(SELECT project_id FROM tasks WHERE id = {task})"
SOURCES = (
    Source(
        "runs",
        EventKind.RUN,
        at="NEW.updated_at",
        keys={
            "run_id": "NEW.id",
            "session_id": "NEW.session_id",
            "session_name": "NEW.session_name",
            "plan_id": _PLAN_OF_TASK.format(task="NEW.task_id"),
            "runner_id": "NEW.runner_id",
            "ref": None,
        },
        data=(
            "type",
            "status",
            "attempts",
            "max_attempts",
            "exit_code",
            "error",
            "cost_usd",
            "cancel_requested",
            "task_id",
        ),
        watched=("status", "attempts", "cancel_requested", "session_id"),
    ),
    Source(
        "run_logs",
        EventKind.LOG,
        at="NEW.ts",
        keys={
            "run_id": "r.id",
            "session_id": "r.session_id",
            "session_name": "r.session_name",
            "plan_id": _PLAN_OF_TASK.format(task="r.task_id"),
            "runner_id": "r.runner_id",
            "ref": "NEW.id",  # the text is read from run_logs, not copied
        },
        data=("attempt", "line_no", "stream", "ts"),
        watched=(),  # lines are only inserted
        from_run=True,
        when_inserted="NEW.line_no >= 0",  # retention's marker line is not a line of the run
    ),
    Source(
        "sessions",
        EventKind.SESSION,
        at="NEW.updated_at",
        keys={
            "run_id": "NEW.last_run_id",
            "session_id": "NEW.id",
            "session_name": "NEW.name",
            "plan_id": None,
            "runner_id": "NEW.runner_id",
            "ref": None,
        },
        data=("name", "runs", "cost_usd", "is_error", "last_run_id"),
        watched=("name", "runs", "cost_usd", "is_error", "last_run_id"),
    ),
    Source(
        "tasks",
        EventKind.TASK,
        at="NEW.updated_at",
        keys={
            "run_id": "NEW.run_id",
            "session_id": "NEW.session_id",
            "session_name": None,
            "plan_id": "NEW.project_id",
            "runner_id": None,
            "ref": None,
        },
        data=(
            "key",
            "title",
            "status",
            "attempts",
            "run_id",
            "commit_sha",
            "merge_sha",
            "last_error",
            "cost_usd",
        ),
        watched=("status", "attempts", "run_id", "commit_sha", "merge_sha", "cost_usd"),
    ),
    Source(
        "projects",
        EventKind.PLAN,
        at="NEW.updated_at",
        keys={
            "run_id": None,
            "session_id": None,
            "session_name": None,
            "plan_id": "NEW.id",
            "runner_id": None,
            "ref": None,
        },
        data=(
            "repo_path",
            "target_branch",
            "paused",
            "pause_reason",
            "cost_usd",
            "budget_usd",
            "workers",
        ),
        watched=("paused", "pause_reason", "cost_usd", "budget_usd", "workers"),
    ),
    Source(
        "runners",
        EventKind.RUNNER,
        # No updated_at: the latest of its times (registered, heartbeat, drain, stop).
        at="{greatest}(NEW.registered_at, NEW.last_heartbeat_at, "
        "COALESCE(NEW.drain_at, 0), COALESCE(NEW.stopped_at, 0))",
        keys={
            "run_id": None,
            "session_id": None,
            "session_name": None,
            "plan_id": None,
            "runner_id": "NEW.id",
            "ref": None,
        },
        data=("name", "state", "transport", "slots"),
        watched=("state", "transport", "slots"),
    ),
)
COLUMNS = ("kind", "at", "run_id", "session_id", "session_name", "plan_id", "runner_id", "ref")

# Migration 11: a task's event also when a step of its attempt is done (``steps``: the
# names of the steps done so far, in order), and actors and pools.
_TASKS = SOURCES[3]
TASK_STEPS = replace(
    _TASKS,
    data=(*_TASKS.data, "steps={steps_done}"),
    watched=(*_TASKS.watched, "steps"),
)
_NO_RUN_KEYS: dict[str, str | None] = {
    "run_id": None,
    "session_id": None,
    "session_name": None,
    "plan_id": None,
}
# 1 while the actor has a placement, 0 once released (the same integer on both databases).
_PLACED = "placed=(SELECT COUNT(*) FROM actor_placements p WHERE p.actor_id = {id})"
_ACTOR_DATA = (
    "name=a.name",
    "key=a.key",
    "state=a.state",
    "generation=a.generation",
    "will_wake=a.will_wake",
    "going_away=a.going_away",
    "destroying=a.destroying",
    "restarts=a.restarts",
)
ACTOR_SOURCES = (
    Source(
        "actors",
        EventKind.ACTOR,
        at="NEW.updated_at",
        keys={
            **_NO_RUN_KEYS,
            "runner_id": "(SELECT runner_id FROM actor_placements WHERE actor_id = NEW.id)",
            "ref": None,
            "actor_id": "NEW.id",
            "pool": "NEW.pool",
        },
        data=(*(d.replace("=a.", "=NEW.") for d in _ACTOR_DATA), _PLACED.replace("{id}", "NEW.id")),
        watched=("state", "generation", "will_wake", "going_away", "destroying", "restarts"),
    ),
    # Where an actor runs is its placement row: placed on a runner (INSERT), released
    # (DELETE). The actor's row was saved first in the same transaction: its time is
    # the change's.
    Source(
        "actor_placements",
        EventKind.ACTOR,
        at="a.updated_at",
        keys={
            **_NO_RUN_KEYS,
            "runner_id": "NEW.runner_id",
            "ref": None,
            "actor_id": "NEW.actor_id",
            "pool": "a.pool",
        },
        data=(*_ACTOR_DATA, _PLACED.replace("{id}", "NEW.actor_id")),
        watched=(),
        joined="FROM actors a WHERE a.id = NEW.actor_id",
        on_delete=True,
    ),
    Source(
        "pools",
        EventKind.POOL,
        at="NEW.updated_at",
        keys={**_NO_RUN_KEYS, "runner_id": None, "ref": None, "actor_id": None, "pool": "NEW.name"},
        data=("serverless={serverless}", "wanted_slots", "desired_runners"),
        watched=("serverless", "wanted_slots", "desired_runners"),
    ),
    Source(
        "pool_errors",
        EventKind.POOL,
        at="NEW.at",
        keys={**_NO_RUN_KEYS, "runner_id": None, "ref": None, "actor_id": None, "pool": "NEW.pool"},
        data=("error_kind=NEW.kind", "error=NEW.message"),
        watched=(),
    ),
)
# Per dialect: SQL the sources' texts name in braces.
_SNIPPETS = {
    "sqlite": {
        "greatest": "MAX",
        "steps_done": "json((SELECT json_group_array(key) FROM json_each(NEW.steps)))",
        "serverless": "json(NEW.serverless)",
    },
    "postgres": {
        "greatest": "GREATEST",
        "steps_done": "(SELECT COALESCE(json_agg(k), '[]'::json) "
        "FROM json_object_keys(NEW.steps::json) k)",
        "serverless": "NEW.serverless::json",
    },
}

_TABLES = {
    "sqlite": """
CREATE TABLE events (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    {columns}
);
""",
    "postgres": """
CREATE TABLE events (
    seq          BIGSERIAL PRIMARY KEY,
    id           BIGINT UNIQUE,
    {columns}
);
CREATE INDEX events_unnumbered ON events (seq) WHERE id IS NULL;
""",
}
_COLUMNS = """kind         TEXT NOT NULL,
    at           {real} NOT NULL,
    run_id       TEXT,
    session_id   TEXT,
    session_name TEXT,
    plan_id      TEXT,
    runner_id    TEXT,
    ref          BIGINT,
    data         TEXT NOT NULL"""
_COMMON = """
CREATE INDEX events_by_at ON events (at);
CREATE TABLE event_log (
    one             INTEGER PRIMARY KEY CHECK (one = 1),
    last_id         BIGINT NOT NULL,
    deleted_through BIGINT NOT NULL
);
INSERT INTO event_log (one, last_id, deleted_through) VALUES (1, 0, 0);
"""


def migration(dialect: str) -> str:
    """The events table and a trigger for each source; every statement on one line of its
    own ending in ';' (a trigger's body holds ';' inside the line)."""
    real = "REAL" if dialect == "sqlite" else "DOUBLE PRECISION"
    table = _TABLES[dialect].format(columns=_COLUMNS.format(real=real))
    triggers = [line for source in SOURCES for line in _triggers(source, dialect)]
    return table + _COMMON + "\n".join(triggers) + "\n"


def actor_migration(dialect: str) -> str:
    """Migration 11: the events' actor and pool columns, the pools' demand (what their
    autoscaler last wanted, written when it changes: a pool event), the tasks' triggers
    again (a step done is an event) and the triggers of actors and pools."""
    lines = [
        "ALTER TABLE events ADD COLUMN actor_id TEXT;",
        "ALTER TABLE events ADD COLUMN pool TEXT;",
        "ALTER TABLE pools ADD COLUMN wanted_slots INTEGER;",
        "ALTER TABLE pools ADD COLUMN desired_runners INTEGER;",
    ]
    if dialect == "sqlite":
        lines += ["DROP TRIGGER events_tasks_insert;", "DROP TRIGGER events_tasks_update;"]
    else:
        lines += [
            "DROP TRIGGER events_tasks_insert ON tasks;",
            "DROP TRIGGER events_tasks_update ON tasks;",
            "DROP FUNCTION events_tasks();",
        ]
    for source in (TASK_STEPS, *ACTOR_SOURCES):
        lines += _triggers(source, dialect)
    return "\n".join(lines) + "\n"


# Every column of an event as readers see it, id first (``numbered_events``).
_EVENT_COLUMNS = "kind, at, run_id, session_id, session_name, plan_id, runner_id, ref, data, "
_EVENT_COLUMNS += "actor_id, pool"


def numbering_migration(dialect: str) -> str:
    """Migration 18: on PostgreSQL, ids in a narrow table of their own. Numbering had
    rewritten each event row to give it its id: a new version of a ~350-byte row and an
    entry in each of its four indexes, whose WAL the numbering's commit flushed while the
    writers' commits queued behind it (4.6 ms a numbering, p50, with 50 streams open). Now
    the trigger's row is never updated: a queue row (its ``seq``) says it has no id yet, and
    numbering moves it to ``event_ids`` (id, seq). SQLite gives ids on insert (see
    ``corral.store.events``); there the view is the table. Readers read the view."""
    if dialect == "sqlite":
        return f"CREATE VIEW numbered_events AS SELECT id, {_EVENT_COLUMNS} FROM events;\n"
    columns = ", ".join(f"e.{c.strip()}" for c in _EVENT_COLUMNS.split(","))
    return _NUMBERING_POSTGRES.format(columns=columns)


_NUMBERING_POSTGRES = """
CREATE TABLE event_ids (id BIGINT PRIMARY KEY, seq BIGINT NOT NULL);
CREATE TABLE event_queue (seq BIGINT PRIMARY KEY);
INSERT INTO event_ids (id, seq) SELECT id, seq FROM events WHERE id IS NOT NULL;
INSERT INTO event_queue (seq) SELECT seq FROM events WHERE id IS NULL;
DROP INDEX events_unnumbered;
ALTER TABLE events DROP COLUMN id;
CREATE FUNCTION events_queue() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN INSERT INTO event_queue (seq) VALUES (NEW.seq); RETURN NULL; END $$;
CREATE TRIGGER events_queue AFTER INSERT ON events FOR EACH ROW EXECUTE FUNCTION events_queue();
CREATE VIEW numbered_events AS SELECT i.id, {columns}
FROM event_ids i JOIN events e ON e.seq = i.seq;
"""


def _triggers(source: Source, dialect: str) -> list[str]:
    snippets = _SNIPPETS[dialect]
    found: list[str] = []
    events = ["insert", "delete"] if source.on_delete else ["insert"]
    for event in events:
        row = "OLD" if event == "delete" else "NEW"
        insert = _insert(source, dialect, row)
        when = source.when_inserted if event == "insert" else None
        found += _trigger(source, dialect, event, insert.format(**snippets), when)
    if source.watched:
        changed = " OR ".join(
            f"OLD.{c} IS {'NOT' if dialect == 'sqlite' else 'DISTINCT FROM'} NEW.{c}"
            for c in source.watched
        )
        insert = _insert(source, dialect, "NEW").format(**snippets)
        found += _trigger(source, dialect, "update", insert, changed)
    return found


def _insert(source: Source, dialect: str, row: str) -> str:
    """The INSERT into events a trigger makes; ``row``: NEW, or OLD for a DELETE."""
    insert = _insert_select(source, dialect)
    if source.from_run:
        insert += " FROM runs r WHERE r.id = NEW.run_id"
    if source.joined:
        insert += f" {source.joined}"
    return insert.replace("NEW.", f"{row}.") if row != "NEW" else insert


def _insert_select(source: Source, dialect: str) -> str:
    """``INSERT INTO events (…) SELECT <the event's values over NEW>``."""
    keys = list(source.keys)
    values = [f"'{source.kind.value}'", source.at]
    values += [source.keys[c] or "NULL" for c in keys]
    pairs = []
    for item in source.data:
        name, _, expression = item.partition("=")
        pairs.append(f"'{name}', {expression or f'NEW.{name}'}")
    joined = ", ".join(pairs)
    values.append(
        f"json_object({joined})" if dialect == "sqlite" else f"json_build_object({joined})::text"
    )
    return f"INSERT INTO events (kind, at, {', '.join(keys)}, data) SELECT {', '.join(values)}"


def _trigger(source: Source, dialect: str, event: str, insert: str, when: str | None) -> list[str]:
    name = f"events_{source.table}"
    trigger = f"{name}_{event}"
    timing = f"AFTER {event.upper()} ON {source.table} FOR EACH ROW"
    if dialect == "sqlite":
        condition = f" WHEN {when}" if when else ""
        return [f"CREATE TRIGGER {trigger} {timing}{condition} BEGIN {insert}; END;"]
    function = trigger if source.on_delete else name  # one function serves NEW's triggers
    found = []
    if source.on_delete or event != "update":
        found.append(
            f"CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN {insert}; RETURN NULL; END $$;"
        )
    condition = f" WHEN ({when})" if when else ""
    found.append(f"CREATE TRIGGER {trigger} {timing}{condition} EXECUTE FUNCTION {function}();")
    return found


# Migration 22: each table's sources as they stand since migration 11, and the primary key
# that pairs an updated row's old and new versions (``id`` unless named here).
LATEST_SOURCES = (*SOURCES[:3], TASK_STEPS, *SOURCES[4:], *ACTOR_SOURCES)
_PRIMARY_KEYS = {"actor_placements": "actor_id", "pools": "name"}
# Tables whose rows are updated one a statement, mostly in no watched column (a runner's
# heartbeat and command indexes, a pool's scaler lease): a row trigger's WHEN skips those
# with no call, where a statement trigger costs each ~13 µs (its call, its empty INSERT).
_UPDATED_A_ROW_AT_A_TIME = {"runners", "pools"}


def statement_migration(dialect: str) -> str:
    """Migration 22: on PostgreSQL, one trigger call a statement instead of one a row. A
    row trigger called a plpgsql function for each event, and the events' own row trigger
    another to queue it (~10 and ~7 µs a row); a claim of 8 runs made 16 calls. Now each
    table's trigger reads the rows its statement changed from transition tables and
    writes their events, in the order of their primary key (so of ``seq``), and queues
    them, in one statement; the updates of runners and pools stay per row (with the queue
    in the same statement). Nothing else writes events. SQLite has no transition tables:
    its triggers stay per row."""
    if dialect == "sqlite":
        return ""
    lines = ["DROP TRIGGER events_queue ON events;", "DROP FUNCTION events_queue();"]
    for source in LATEST_SOURCES:
        changes = ["insert", *(["update"] if source.watched else [])]
        changes += ["delete"] if source.on_delete else []
        name = f"events_{source.table}"
        lines += [f"DROP TRIGGER {name}_{change} ON {source.table};" for change in changes]
        functions = [f"{name}_{change}" for change in changes] if source.on_delete else [name]
        lines += [f"DROP FUNCTION {function}();" for function in functions]
        for change in changes:
            if change == "update" and source.table in _UPDATED_A_ROW_AT_A_TIME:
                lines += _queued_row_update(source)
            else:
                lines += _statement_trigger(source, change)
    return "\n".join(lines) + "\n"


def _queued(insert: str) -> str:
    """The INSERT into events and into the queue of the rows inserted, as one statement."""
    return f"WITH e AS ({insert} RETURNING seq) INSERT INTO event_queue (seq) SELECT seq FROM e"


def _function(name: str, insert: str) -> str:
    return (
        f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN {_queued(insert)}; RETURN NULL; END $$;"
    )


def _queued_row_update(source: Source) -> list[str]:
    function = f"events_{source.table}_update"
    changed = " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in source.watched)
    return [
        _function(function, _insert(source, "postgres", "NEW").format(**_SNIPPETS["postgres"])),
        f"CREATE TRIGGER {function} AFTER UPDATE ON {source.table} FOR EACH ROW "
        f"WHEN ({changed}) EXECUTE FUNCTION {function}();",
    ]


def _statement_trigger(source: Source, change: str) -> list[str]:
    # The rows read as ``n`` (inserted, or updated: their new version) or ``o`` (deleted, or
    # updated: their old version, paired by primary key).
    row = "o" if change == "delete" else "n"
    rows = [f"{'old' if change == 'delete' else 'new'}_rows {row}"]
    conditions = []
    if source.from_run:
        rows.append("runs r")
        conditions.append("r.id = NEW.run_id")
    if source.joined:
        joined, _, condition = source.joined.removeprefix("FROM ").partition(" WHERE ")
        rows.append(joined)
        conditions.append(condition)
    if change == "insert" and source.when_inserted:
        conditions.append(source.when_inserted)
    key = _PRIMARY_KEYS.get(source.table, "id")
    if change == "update":
        rows.append("old_rows o")
        changed = " OR ".join(f"o.{c} IS DISTINCT FROM NEW.{c}" for c in source.watched)
        conditions += [f"o.{key} = NEW.{key}", f"({changed})"]
    insert = _insert_select(source, "postgres") + f" FROM {', '.join(rows)}"
    if conditions:
        insert += f" WHERE {' AND '.join(conditions)}"
    insert += f" ORDER BY NEW.{key}"
    insert = insert.format(**_SNIPPETS["postgres"]).replace("NEW.", f"{row}.")
    tables = {"insert": "NEW TABLE AS new_rows", "delete": "OLD TABLE AS old_rows"}
    function = f"events_{source.table}_{change}"
    return [
        _function(function, insert),
        f"CREATE TRIGGER {function} AFTER {change.upper()} ON {source.table} REFERENCING "
        f"{tables.get(change, 'OLD TABLE AS old_rows NEW TABLE AS new_rows')} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {function}();",
    ]
