"""The event log's table and the triggers that write it: one per table whose changes are
events, generated for each dialect from ``SOURCES`` (see ``corral.store.events``)."""

from __future__ import annotations

from dataclasses import dataclass

from corral.events import EventKind


@dataclass(frozen=True)
class Source:
    """A table whose rows' changes are events of ``kind``: columns of the events row as SQL
    over ``NEW`` (``None``: NULL), what ``data`` holds, and the columns whose change is one."""

    table: str
    kind: EventKind
    at: str
    keys: dict[str, str | None]  # run_id, session_id, session_name, plan_id, runner_id, ref
    data: tuple[str, ...]  # columns of NEW, by name
    watched: tuple[str, ...]  # an UPDATE changing none of these is no event
    from_run: bool = False  # keys are read from the run row ``r`` the line belongs to
    when_inserted: str | None = None  # a condition on NEW for an INSERT to be an event


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


def _triggers(source: Source, dialect: str) -> list[str]:
    greatest = "MAX" if dialect == "sqlite" else "GREATEST"
    values = [f"'{source.kind.value}'", source.at.format(greatest=greatest)]
    values += [source.keys[c] or "NULL" for c in COLUMNS[2:]]
    pairs = ", ".join(f"'{c}', NEW.{c}" for c in source.data)
    values.append(
        f"json_object({pairs})" if dialect == "sqlite" else f"json_build_object({pairs})::text"
    )
    insert = f"INSERT INTO events ({', '.join(COLUMNS)}, data) SELECT {', '.join(values)}"
    if source.from_run:
        insert += " FROM runs r WHERE r.id = NEW.run_id"
    name = f"events_{source.table}"
    inserted = source.when_inserted
    if dialect == "sqlite":
        changed = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in source.watched)
        found = [
            f"CREATE TRIGGER {name}_insert AFTER INSERT ON {source.table} FOR EACH ROW"
            f"{f' WHEN {inserted}' if inserted else ''} BEGIN {insert}; END;"
        ]
        if changed:
            found.append(
                f"CREATE TRIGGER {name}_update AFTER UPDATE ON {source.table} FOR EACH ROW "
                f"WHEN {changed} BEGIN {insert}; END;"
            )
        return found
    changed = " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in source.watched)
    found = [
        f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN {insert}; RETURN NULL; END $$;",
        f"CREATE TRIGGER {name}_insert AFTER INSERT ON {source.table} FOR EACH ROW"
        f"{f' WHEN ({inserted})' if inserted else ''} EXECUTE FUNCTION {name}();",
    ]
    if changed:
        found.append(
            f"CREATE TRIGGER {name}_update AFTER UPDATE ON {source.table} FOR EACH ROW "
            f"WHEN ({changed}) EXECUTE FUNCTION {name}();"
        )
    return found
