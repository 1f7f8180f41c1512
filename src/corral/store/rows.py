"""Mapping between database rows and domain records (JSON columns, enums, typed ids)."""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Iterable, Sequence
from typing import Any

from corral.errors import NotFound
from corral.ids import RunnerId, new_run_id
from corral.runners import Runner, RunnerState
from corral.runs import AgentSpec, NewRun, Run, RunStatus, RunType
from corral.sessions import Session
from corral.store.db import Row, Tx


def sql_list(values: Iterable[str]) -> str:
    """Enum values as a literal SQL list (``'claimed', 'running'``), for ``IN (…)``."""
    return ", ".join(f"'{value}'" for value in sorted(values))


def sql_in(column: str, values: Iterable[str]) -> str:
    """``column`` among enum values, written as the partial indexes in ``schema.py`` are:
    ``status = 'pending'`` for one value (SQLite uses an index ``WHERE status = 'pending'``
    only for that very term, never for ``status IN ('pending')``), ``IN (…)`` for more."""
    listed = sorted(values)
    if len(listed) == 1:
        return f"{column} = '{listed[0]}'"
    return f"{column} IN ({sql_list(listed)})"


# The statuses in which a runner holds a run (``RunStatus.holds_lease``), for SQL.
HELD = sql_list(status for status in RunStatus if status.holds_lease)


def row_by_id(tx: Tx, table: str, row_id: str, lock: str = "") -> Row:
    """The row of ``table`` with this id, locked with ``lock``; else NotFound of its kind
    (``runs`` → ``run_not_found``)."""
    row = tx.one(f"SELECT * FROM {table} WHERE id = ? {lock}", (row_id,))
    if row is None:
        raise NotFound.of(table.removesuffix("s"), row_id)
    return row


def update_row(
    tx: Tx, table: str, row_id: str, now: float, *, only_if: Row | None = None, **fields: Any
) -> Row | None:
    """Set ``fields`` (and ``updated_at``) on the row of ``table`` with this id; with
    ``only_if``, only while those columns still hold those values. The row as written, or
    None if it did not match."""
    values = {**fields, "updated_at": now}
    guard = {"id": row_id, **(only_if or {})}
    return tx.one(
        f"UPDATE {table} SET {', '.join(f'{name} = ?' for name in values)} "
        f"WHERE {' AND '.join(f'{name} = ?' for name in guard)} RETURNING *",
        (*values.values(), *guard.values()),
    )


# Parameters a SQLite statement may bind.
MAX_PARAMETERS = 32766


def insert_runs(tx: Tx, rows: Sequence[Row], dialect: str = "") -> list[Run]:
    """Write new runs (rows made by ``new_run_row``); the runs as written, in ``rows``' order.

    Stored in id order: a batch's runs share their creation time, so claims take them by id
    (``claims.py``), and on SQLite a row's place in the table is its insertion's. Inserted
    as they came (random ids), the 8 runs of a claim lay on 8 pages, each written again at
    the claim's commit, the start's and the end's (a page a run each time, against a page
    for several).

    On SQLite (``dialect``) many rows a statement, not a statement a row (``Tx.many``): a
    batch of 500 cost 24-31 µs a run so, 17-21 this way. On PostgreSQL too, but as one
    parameter, the rows as a JSON array that the server reads into rows of ``runs`` (their
    columns' types are the table's): psycopg's reading of a statement with thousands of
    parameters cost 113 µs a run, its executemany (a statement a row, and each statement's
    event trigger called) 30."""
    if not rows:
        return []
    stored = sorted(rows, key=lambda row: row["id"])
    if dialect != "sqlite":
        columns = list(rows[0])
        if len(stored) == 1:
            tx.execute(_insert_into_runs(columns), list(stored[0].values()))
        else:
            names = ", ".join(columns)
            tx.execute(
                f"INSERT INTO runs ({names}) SELECT {names} "
                "FROM json_populate_recordset(NULL::runs, ?::json)",
                (dumps(stored),),
            )
        return [_written_run(row) for row in rows]
    # Only the columns some run of the batch sets: the others are left NULL (no column of
    # runs that may be NULL has a default). The sqlite3 module binds a None through its
    # adaptation (a registry look-up, then an AttributeError formatted and dropped), and a
    # command's run has 20: 74,000 instructions a run of store_cost.py (6.5 %).
    columns = _set_columns(stored)
    values = operator.itemgetter(*columns)
    per_statement = MAX_PARAMETERS // len(columns)
    for first in range(0, len(stored), per_statement):
        chunk = stored[first : first + per_statement]
        tx.execute(
            _insert_into_runs(columns, len(chunk)),
            [value for row in chunk for value in values(row)],
        )
    return [_written_run(row) for row in rows]


def _set_columns(rows: Sequence[Row]) -> list[str]:
    """The columns some row sets (not None), in the rows' order. Those the first row sets,
    then those it leaves None that another sets: each of these is looked for in one call a
    row (an itemgetter of them all), not a generator step a row and column (20 columns of
    500 rows: 1.7 µs a run)."""
    first = rows[0]
    unset = [column for column, value in first.items() if value is None]
    if not unset:
        return list(first)
    of_unset = operator.itemgetter(*unset)  # one column: its value, not a tuple
    none = of_unset(first)
    found: set[str] = set()
    for row in rows:
        if of_unset(row) != none:
            found.update(column for column in unset if row[column] is not None)
    return [column for column, value in first.items() if value is not None or column in found]


def _written_run(row: Row) -> Run:
    """The run a row made by ``new_run_row`` holds once written: ``run_from_row``'s run
    (``tests/unit/test_rows.py``), made from a copy of the row, whose columns are a new
    run's fields but ``updated_at``. Half the cost of ``run_from_row`` (6.6 µs a command
    run), which picks each field by name for rows of any read."""
    fields = row.copy()
    del fields["updated_at"]
    fields["exit_code"] = None
    fields["lost_at"] = None
    return _run(fields, None, None)


def _insert_into_runs(columns: Sequence[str], rows: int = 1) -> str:
    one = f"({', '.join('?' for _ in columns)})"
    return f"INSERT INTO runs ({', '.join(columns)}) VALUES {', '.join(one for _ in range(rows))}"


# One encoder for every write: ``json.dumps`` with any argument makes one at each call, and
# that was half the instructions of encoding a run's labels or env (~9,000 of ~16,000).
_encode = json.JSONEncoder(separators=(",", ":")).encode


def dumps(value: Any) -> str:
    """A JSON column's value, compact (as ``json.dumps(value, separators=(",", ":"))``)."""
    return _encode(value)


def loads(text: str) -> Any:
    """A JSON column's value. A row written before corral refused lone surrogates may hold
    one (as a ``\\udXXX`` escape; no UTF-8 answer can carry it): it reads as U+FFFD, so no
    listing that includes the row fails. Valid pairs decode to their character first."""
    if text == "[]":  # most runs' labels, and their env as "{}": no parse (a read per run)
        return []
    if text == "{}":
        return {}
    value = json.loads(text)
    return _no_lone_surrogates(value) if "\\ud" in text.lower() else value


def _no_lone_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_no_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_no_lone_surrogates(k): _no_lone_surrogates(v) for k, v in value.items()}
    return value


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


# Column values to their enums by a dict lookup: calling the enum costs more (rows are read
# several times in each run's life).
_RUN_TYPES = {str(t): t for t in RunType}
_RUN_STATUSES = {str(s): s for s in RunStatus}


# The run's fields that are its columns' values as they are, then those parsed, then those
# of columns added later (rows made by hand may lack them): every column a run is read from.
_AS_STORED = (
    "prompt",
    "session_name",
    "session_id",
    "project_dir",
    "timeout_s",
    "idle_timeout_s",
    "max_attempts",
    "attempts",
    "priority",
    "required_runner",
    "exit_code",
    "error",
    "result",
    "cost_usd",
    "num_turns",
    "rate_limited",
    "available_at",
    "created_at",
    "claimed_at",
    "started_at",
    "finished_at",
)
_PARSED = (
    "id",  # RunId and RunnerId are the str they wrap: no call for them
    "type",
    "status",
    "command",
    "agent",
    "labels",
    "runner_id",
    "env",
    "usage",
    "cancel_requested",
)
_ADDED = ("task_id", "parent_session_id", "callback", "depth", "lost_at")
_IN_EVERY_ROW = (*_AS_STORED, *_PARSED)
_in_every_row = operator.itemgetter(*_IN_EVERY_ROW)
_COLUMNS = (*_IN_EVERY_ROW, *_ADDED)
# What a read joins to a run's row about the callback it owed (``_callback_state``).
_CALLBACK_COLUMNS = frozenset(("callback_recorded", "callback_run_id", "callback_dropped"))
# Commands as parsed, by their JSON: runs mostly repeat a few (each parse cost 1.2 µs, a
# run is read from its row three times in its life at least). Tuples of str: shared.
_COMMANDS: dict[str, tuple[str, ...]] = {}
_COMMANDS_KEPT = 1000


def run_from_row(row: Row) -> Run:
    """The run a row of ``runs`` holds (``tests/unit/test_rows.py`` checks it has every
    field, and equals the one the constructor makes)."""
    fields = dict(zip(_IN_EVERY_ROW, _in_every_row(row), strict=True))
    get = row.get
    for name in _ADDED:
        fields[name] = get(name)
    return _run(fields, _callback_state(row), get("callback_run_id"))


def runs_from_tuples(names: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> list[Run]:
    """The runs rows of ``runs`` hold, as tuples of the columns ``names`` (``Tx.named_tuples``):
    no dict a row first (the claim's and the final reports' ``RETURNING *``, twice in each
    run's life). A command run's row made a dict, then a run, cost 68,000 instructions
    (callgrind); this 43,000."""
    if not rows:
        return []
    values = _COLUMN_GETTERS.get(tuple(names))
    if values is None:
        if not set(_COLUMNS) <= set(names) or _CALLBACK_COLUMNS & set(names):
            return [run_from_row(dict(zip(names, row, strict=True))) for row in rows]
        if len(_COLUMN_GETTERS) >= 100:  # reads of whole runs are few: never, but bounded
            _COLUMN_GETTERS.clear()
        values = _COLUMN_GETTERS[tuple(names)] = operator.itemgetter(
            *(list(names).index(name) for name in _COLUMNS)
        )
    return [_run(dict(zip(_COLUMNS, values(row), strict=True)), None, None) for row in rows]


# By the column names of a read: where each of ``_COLUMNS`` is in its rows.
_COLUMN_GETTERS: dict[tuple[str, ...], operator.itemgetter[Any]] = {}


def _run(fields: dict[str, Any], callback_state: str | None, callback_run_id: str | None) -> Run:
    """The run whose columns ``fields`` holds as stored (``_COLUMNS``; parsed in place),
    made without ``Run``'s ``__init__``, which sets each of its fields through
    ``object.__setattr__`` as a frozen dataclass does: ``fields`` is its dict. A command
    run's row took 5.5 µs with the constructor."""
    agent, usage = fields["agent"], fields["usage"]
    fields["type"] = _RUN_TYPES[fields["type"]]
    fields["status"] = _RUN_STATUSES[fields["status"]]
    fields["command"] = _command(fields["command"])
    fields["agent"] = AgentSpec.from_dict(loads(agent)) if agent else None
    fields["labels"] = tuple(loads(fields["labels"]))
    fields["runner_id"] = fields["runner_id"] or None
    fields["env"] = loads(fields["env"])
    fields["usage"] = loads(usage) if usage else None
    fields["cancel_requested"] = bool(fields["cancel_requested"])
    fields["depth"] = int(fields["depth"] or 0)
    fields["task"] = None  # a claim adds it, for the runner
    fields["callback_state"] = callback_state
    fields["callback_run_id"] = callback_run_id
    made = object.__new__(Run)
    object.__setattr__(made, "__dict__", fields)
    return made


def _command(stored: str) -> tuple[str, ...]:
    command = _COMMANDS.get(stored)
    if command is None:
        if len(_COMMANDS) >= _COMMANDS_KEPT:
            _COMMANDS.clear()
        command = _COMMANDS[stored] = tuple(loads(stored))
    return command


def _callback_state(row: Row) -> str | None:
    """What became of the callback a run owed its parent (rows read with it only)."""
    if not row.get("callback_recorded"):
        return None
    if row.get("callback_run_id"):
        return "delivered"
    dropped: str | None = row.get("callback_dropped")
    return dropped or "pending"


def runner_from_row(row: Row) -> Runner:
    return Runner(
        id=RunnerId(row["id"]),
        name=row["name"],
        hostname=row["hostname"],
        labels=tuple(loads(row["labels"])),
        slots=row["slots"],
        version=row["version"],
        transport=row["transport"],
        state=RunnerState(row["state"]),
        registered_at=row["registered_at"],
        last_heartbeat_at=row["last_heartbeat_at"],
        slots_used=int(row.get("slots_used") or 0),
        coordinator_url=row.get("coordinator_url"),
    )


def session_from_row(row: Row) -> Session:
    return Session(
        id=row["id"],
        name=row["name"],
        agent_name=row["agent_name"],
        runner_id=RunnerId(row["runner_id"]) if row["runner_id"] else None,
        project_dir=row["project_dir"],
        last_run_id=row["last_run_id"],
        result=row["result"],
        is_error=bool(row["is_error"]),
        cost_usd=row["cost_usd"],
        runs=row["runs"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


# A command's JSON by the command: a batch's runs mostly share theirs (encoding one cost
# 2.5 µs, a third of ``new_run_row``). Bounded as ``_COMMANDS``.
_COMMAND_TEXTS: dict[tuple[str, ...], str] = {}
# As stored: a dict lookup, not ``str()`` of the enum.
_TYPE_TEXTS = {t: str(t) for t in RunType}
_PENDING = str(RunStatus.PENDING)


def new_run_row(spec: NewRun, now: float) -> Row:
    command = _COMMAND_TEXTS.get(spec.command)
    if command is None:
        if len(_COMMAND_TEXTS) >= _COMMANDS_KEPT:
            _COMMAND_TEXTS.clear()
        command = _COMMAND_TEXTS[spec.command] = dumps(list(spec.command))
    return {
        "id": new_run_id(),
        "type": _TYPE_TEXTS[spec.type],
        "status": _PENDING,
        "prompt": spec.prompt,
        "command": command,
        "session_name": spec.session_name,
        "session_id": spec.session_id,
        "agent": dumps(spec.agent.to_dict()) if spec.agent else None,
        "project_dir": spec.project_dir,
        "labels": dumps(sorted(spec.labels)) if spec.labels else "[]",  # as ``loads`` reads
        "env": dumps(spec.env) if spec.env else "{}",
        "timeout_s": spec.timeout_s,
        "idle_timeout_s": spec.idle_timeout_s,
        "max_attempts": spec.max_attempts,
        "attempts": 0,
        "priority": spec.priority,
        "required_runner": spec.required_runner,
        "task_id": spec.task_id,
        "runner_id": None,
        "error": None,
        "result": None,
        "cost_usd": None,
        "usage": None,
        "num_turns": None,
        "cancel_requested": 0,
        "rate_limited": 0,
        "available_at": now,
        "created_at": now,
        "claimed_at": None,
        "started_at": None,
        "finished_at": None,
        "updated_at": now,
        # Resolved and checked by the store (``callbacks.check_children``) before written.
        "parent_session_id": spec.parent_session,
        "callback": spec.callback,
        "depth": 0,
    }
