"""The claim, and the lease it takes: who may still act on a run.

A claim gives pending runs to an active runner and takes their lease (runner id, attempt
number) in one transaction. Every later report about the run names that lease; a report
from anyone else is refused (``LeaseLost``). These functions run inside the caller's
transaction.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field, replace

from corral.errors import LeaseLost, NotFound
from corral.ids import RunId
from corral.runners import ALIVE, Runner, RunnerState
from corral.runs import Run, RunStatus, may_become
from corral.store.db import Database, Row, Tx
from corral.store.rows import HELD, row_by_id, runs_from_tuples, sql_in
from corral.store.schema import LABEL_CLASS, LAST_CHANGE, PINNED_TO
from corral.store.tasks import task_context

# The statuses a claim takes runs from, as the transition table says (pending), written as
# the index runs_claimable's condition so that the claim reads that index.
CLAIMABLE = sql_in("status", may_become(RunStatus.CLAIMED))


@dataclass(frozen=True)
class Claimable:
    """A pending run ready to be claimed, and what it requires of a runner."""

    run_id: RunId
    required_runner: str | None  # a runner name
    labels: frozenset[str]

    def fits(self, runner: Runner) -> bool:
        """Could ``runner`` claim it? (The claim's own conditions, in memory.)"""
        named = self.required_runner is None or self.required_runner == runner.name
        return named and self.labels <= set(runner.labels)


def has_claimable(tx: Tx, db: Database, now: float, since: float | None) -> bool:
    sql = f"SELECT 1 AS x FROM runs WHERE {CLAIMABLE} AND available_at <= ?"
    params: tuple[float, ...] = (now,)
    if since is not None:
        # Written, or its backoff ended, after ``since``: read along runs_pending_by_change
        # from ``since`` on (a backlog that waits unchanged is not read every second).
        # (In that index's order, so PostgreSQL reads it even before it has statistics.)
        sql += f" AND {LAST_CHANGE[db.dialect]} > ? ORDER BY {LAST_CHANGE[db.dialect]} DESC"
        params += (since,)
    return tx.one(sql + " LIMIT 1", params) is not None


def claimable(tx: Tx, now: float, limit: int) -> list[Claimable]:
    rows = tx.execute(
        "SELECT id, required_runner, labels FROM runs "
        f"WHERE {CLAIMABLE} AND available_at <= ? "
        "ORDER BY priority DESC, created_at, id LIMIT ?",
        (now, limit),
    )
    # Runs share a few label sets: each is parsed once a read (a read is up to 1,000 runs,
    # once a round of the claim board).
    labels: dict[str, frozenset[str]] = {}
    for r in rows:
        if r["labels"] not in labels:
            labels[r["labels"]] = frozenset(json.loads(r["labels"]))
    return [Claimable(RunId(r["id"]), r["required_runner"], labels[r["labels"]]) for r in rows]


def claim(tx: Tx, db: Database, runner_id: str, max_runs: int, now: float) -> list[Run]:
    """Give up to ``max_runs`` pending runs to an active runner.

    On PostgreSQL, ``FOR NO KEY UPDATE SKIP LOCKED`` makes concurrent claimers pass over
    each other's rows, and the claim writes only the row versions it locked; the seemingly
    equivalent ``UPDATE … WHERE id = (SELECT … LIMIT 1)``, with no lock, double-claims
    there under concurrency. On SQLite the immediate transaction holds the
    one write lock, so the same select-then-update is safe.
    """
    if db.dialect == "postgres":
        return _with_tasks(tx, _take_postgres(tx, db, runner_id, max_runs, now, None, None)[0])
    runner = _heard(tx, runner_id, now)
    if runner["state"] != RunnerState.ACTIVE:
        return []  # draining: it finishes what it has and takes nothing new
    return _with_tasks(tx, _take_sqlite(tx, db, runner, max_runs, now))


@dataclass(frozen=True)
class Filled:
    # Claimed, in claim order, but those whose start commands the claim's statement stored
    # (``commands``): claimed before these, each is only its command.
    runs: list[Run]
    free: int  # the runner's slots still free after all it claimed
    # The start commands the claim's statement stored (``fill``'s ``start``): (index, body
    # as stored), in claim order.
    commands: list[tuple[int, str]] = field(default_factory=list)


def fill(
    tx: Tx,
    db: Database,
    runner_id: str,
    now: float,
    finishing: Collection[tuple[str, int]] = (),
    start: str | None = None,
) -> Filled:
    """``claim`` into the runner's free slots, and how many are still free after it: counted
    under the claim's lock of the runner's row, as the claim counts them. ``finishing``:
    (run, attempt) the runner has reported ended, in reports not yet applied — their slots
    are free on the runner though the store still counts them. ``start``: a command's body
    as SQL over the claimed run ``c`` (``commands.START_RUN``); on PostgreSQL the claim's
    statement numbers and stores one for each run it claims (``Filled.commands``; those
    runs are not in ``Filled.runs``), but for a task run, whose start carries what is read
    of its task after the claim."""
    if db.dialect == "postgres":
        # The claim's statement hears the runner and counts its slots itself: one round
        # trip (``_take_postgres``), which stores the start commands too.
        taken, free, commands = _take_postgres(tx, db, runner_id, None, now, finishing, start)
        assert free is not None
        return Filled(_with_tasks(tx, taken), free, commands)
    runner = _heard(tx, runner_id, now)
    held = tx.tuples(
        f"SELECT id, attempts FROM runs WHERE runner_id = ? AND status IN ({HELD})", (runner_id,)
    )
    free = runner["slots"] - sum((run_id, attempt) not in finishing for run_id, attempt in held)
    if runner["state"] != RunnerState.ACTIVE or free <= 0:
        return Filled([], max(0, free))  # draining: it takes nothing new
    runs = _with_tasks(tx, _take_sqlite(tx, db, runner, free, now))
    return Filled(runs, free - len(runs))


def _heard(tx: Tx, runner_id: str, now: float) -> Row:
    """The runner's row, as it asks for runs: it is heard, as by a heartbeat (SQLite; the
    claim's statement does the same on PostgreSQL)."""
    # Its lease, which it counts from when it asked, holds here too (a heartbeat stuck
    # behind an outage no longer ends it while its claims are answered). That write locks
    # its row, so a reconciler cannot declare it lost (and take back what it holds) between
    # the check below and the commit, stranding the new claim; if it is lost already, the
    # check raises and the write is undone with the caller's transaction.
    runner = tx.one(
        # What a claim reads of it: its whole row (``*``) cost SQLite 8.3 µs a claim, this 6.2.
        "UPDATE runners SET last_heartbeat_at = ? WHERE id = ? "
        "RETURNING id, name, labels, slots, state",
        (now, runner_id),
    )
    if runner is None:
        raise NotFound.of("runner", runner_id)
    check_not_lost(runner)
    return runner


def _with_tasks(tx: Tx, taken: list[Run]) -> list[Run]:
    """The runs claimed, in claim order. A task run goes out with its task, project and the
    steps already done: read here, in the claim's transaction, for every transport."""
    runs = [
        replace(run, task=task_context(tx, run.task_id)) if run.task_id else run for run in taken
    ]
    runs.sort(key=lambda r: (-r.priority, r.created_at, r.id))
    return runs


# The label classes of pending runs, a row each (``labels``: what the class's runs require),
# found by skipping through the index runs_pending_by_class: one step a class, however many
# runs it holds. Then the classes the runner's labels (``{labels}``) fit. Only the runs of
# those are read: a backlog of runs it cannot take never hides (nor slows the claim of) one
# it can.
_CLASSES = """WITH RECURSIVE classes (labels) AS (
    SELECT (SELECT labels FROM runs WHERE {claimable} ORDER BY {cls} LIMIT 1)
    UNION ALL
    SELECT (SELECT labels FROM runs WHERE {claimable} AND {cls} > {next_cls} ORDER BY {cls} LIMIT 1)
    FROM classes WHERE classes.labels IS NOT NULL
), fit AS (SELECT labels FROM classes WHERE labels IS NOT NULL AND {fits})"""

# The first runs of one class, in claim order, that require no runner or this one
# (``{pin}``): read along runs_pending_by_class, so only runs this runner may take are
# visited.
_IN_CLASS = (
    "SELECT {columns}id, priority, created_at FROM runs WHERE {claimable} AND {cls} = {this_cls} "
    f"AND {PINNED_TO} = {{pin}} AND available_at <= ?{{after}} "
    "ORDER BY priority DESC, created_at, id LIMIT {limit}"
)
# Past the run (priority, created_at, id) in claim order: a later read of the same claim.
_AFTER = " AND (priority < ? OR (priority = ? AND (created_at > ? OR (created_at = ? AND id > ?))))"


def _classes(db: Database, labels: str) -> str:
    cls = LABEL_CLASS[db.dialect]
    return _CLASSES.format(
        claimable=CLAIMABLE,
        cls=cls,
        next_cls=cls.replace("labels", "classes.labels"),
        fits=db.json_subset("labels").replace("?", labels),
    )


def _pins(runner: Row) -> list[str]:
    """The values of ``PINNED_TO`` a runner may take: no runner required, or itself."""
    return ["", runner["name"]] if runner["name"] else [""]


def _take_sqlite(tx: Tx, db: Database, runner: Row, limit: int, now: float) -> list[Run]:
    """Claim the first ``limit`` runs ``runner`` may take, in claim order: the classes it
    fits, then each class's first runs (for each runner a run may require), merged. The
    immediate transaction holds SQLite's one write lock: nothing is locked row by row."""
    fit = [labels for (labels,) in tx.tuples(_fit_statement(db), (runner["labels"],))]
    params: list[object] = []
    for labels in fit:
        for pin in _pins(runner):
            params += [labels, pin, now, limit]
    if not params:
        return []
    chosen = tx.tuples(_sqlite_arms(len(params) // 4), (*params, limit))
    return _set_claimed(tx, [run_id for run_id, _, _ in chosen], runner["id"], now)


def _fit_statement(db: Database) -> str:
    """The read of the label classes a runner fits (its labels bound to the one ``?``),
    made once (``_take_sqlite``)."""
    statement = _FIT.get(db.dialect)
    if statement is None:
        statement = _FIT[db.dialect] = f"{_classes(db, '?')} SELECT labels FROM fit"
    return statement


_FIT: dict[str, str] = {}


def _sqlite_arms(count: int) -> str:
    """``_take_sqlite``'s read of the first runs of ``count`` (class, pin) arms, made once
    for each count (a claim formatted it anew: a runner fits a class or two)."""
    statement = _SQLITE_ARMS.get(count)
    if statement is None:
        if len(_SQLITE_ARMS) >= 100:  # a runner fitting 50 classes: never, but bounded
            _SQLITE_ARMS.clear()
        arm = _IN_CLASS.format(
            columns="",
            claimable=CLAIMABLE,
            cls="labels",
            this_cls="?",
            pin="?",
            after="",
            limit="?",
        )
        arms = " UNION ALL ".join(f"SELECT * FROM ({arm})" for _ in range(count))
        statement = _SQLITE_ARMS[count] = f"{arms} ORDER BY priority DESC, created_at, id LIMIT ?"
    return statement


_SQLITE_ARMS: dict[int, str] = {}


# Runs a claim on PostgreSQL reads beyond those it wants, and locks the first it can of
# them: runs another claim holds (two store writers claim side by side, from the head of
# the same queue) are passed over in the same statement, not by another read after it
# (0.75 more statements a claim in run_cost.py, 0.03 with these). The price: each label
# class the runner fits reads up to this many more index entries (two reads a class).
_READ_PAST = 16


def _take_postgres(
    tx: Tx,
    db: Database,
    runner_id: str,
    limit: int | None,
    now: float,
    finishing: Collection[tuple[str, int]] | None,
    start: str | None,
) -> tuple[list[Run], int | None, list[tuple[int, str]]]:
    """Hear the runner (as ``_heard``) and claim the first runs it may take, in one
    statement (``_claim_statement``) that also locks the runs it chose, passing over
    those another claim holds (``SKIP LOCKED``). While those leave it short, it reads on
    past the last run read. ``limit``: the most runs to take; None (``fill``): the runner's
    free slots, counted in the same statement (the runs it holds, but those of
    ``finishing``, which it has reported ended); then also how many are still free.
    ``start`` (see ``fill``): the start commands the statements stored, (index, body), for
    the first of the runs in claim order: once a statement stores none for the runs it
    claimed, the next ones store none either (the caller stores the rest, numbered after).
    The runs it returns are those it stored no start command for."""
    taken: list[Run] = []
    commands: list[tuple[int, str]] = []
    after: tuple[object, ...] = ()
    # As JSON, not two arrays: psycopg's list dumper cost 60 µs a claim for 8 runs, this 18.
    ended = json.dumps([{"id": run_id, "attempts": attempt} for run_id, attempt in finishing or ()])
    while True:
        wanted = None if limit is None else limit - len(taken)
        names, rows = tx.named_tuples(
            _claim_statement(db, reading_on=bool(after), start=start),
            (
                runner_id,
                runner_id,
                now,
                limit is None,
                runner_id,
                ended,
                wanted,
                *(x for _ in range(2) for x in (now, *after)),
                *_claim_values(runner_id, now),
                now,
            ),
        )
        summary = dict(zip(names, rows[0], strict=True))
        if summary["read_state"] is None:
            raise NotFound.of("runner", runner_id)
        check_not_lost({"id": runner_id, "state": summary["read_state"]})
        if summary["read_moved"]:
            # Its row changed after this statement's snapshot and before its lock: a claim
            # committed meanwhile may hold slots the count missed. It claimed nothing; now
            # the runner's row is locked, the next statement's snapshot sees them all.
            continue
        at = names.index("id")
        claimed_rows = [r for r in rows if r[at] is not None]
        if start is None:
            taken += runs_from_tuples(names, claimed_rows)
        elif claimed_rows:
            stored = sorted((r[at + 1], r[at + 2]) for r in claimed_rows if r[at + 1] is not None)
            commands += stored
            if not stored:
                # A task run among them: the caller stores their starts, from the runs
                # whole, read as this transaction wrote them (the statement returns only
                # their ids: the rest of each row, decoded and made a Run, cost the store
                # writer more than the commands).
                start = None
                taken += _runs_by_id(tx, [r[at] for r in claimed_rows])
        free = summary["read_free"]
        if free is not None:
            free = max(0, free - len(claimed_rows))
        if len(claimed_rows) >= summary["read_wanted"] or summary["read_n"] < summary["read_limit"]:
            return taken, free, commands
        p, c = summary["read_last_priority"], summary["read_last_created_at"]
        after = (p, p, c, c, summary["read_last_id"])


def _runs_by_id(tx: Tx, ids: list[str]) -> list[Run]:
    return runs_from_tuples(
        *tx.named_tuples(f"SELECT * FROM runs WHERE id IN ({', '.join('?' for _ in ids)})", ids)
    )


# The claim's statement on PostgreSQL, by dialect, whether it reads on past a run and the
# start command it stores: made once (a 4 kB text, several formats and joins).
_CLAIM_STATEMENTS: dict[tuple[str, bool, str | None], str] = {}


def _claim_statement(db: Database, *, reading_on: bool, start: str | None = None) -> str:
    """The statement of ``_take_postgres``: its parameters are the runner's id (twice), now
    (its heartbeat), whether its slots are counted, its id, the runs it has reported ended
    (JSON: ``[{"id": …, "attempts": …}, …]``), the most runs to take (None: its free
    slots), for each of its two pins now (and the last run read if ``reading_on``), the
    claim's values (``_claim_values``) and now. With ``start`` (SQL over the claimed run ``c``: see
    ``fill``), it also numbers and stores a command of that body for each run it claims,
    unless one of them is a task run: then none; and returns of each run claimed only its
    id beside its command (not its whole row)."""
    key = (db.dialect, reading_on, start)
    statement = _CLAIM_STATEMENTS.get(key)
    if statement is not None:
        return statement
    cls = LABEL_CLASS[db.dialect]
    arms = [
        _IN_CLASS.format(
            columns="ctid AS version, ",
            claimable=CLAIMABLE,
            cls=cls,
            this_cls=cls.replace("labels", "fit.labels"),
            pin=pin,
            after=_AFTER if reading_on else "",
            limit="(SELECT read FROM wanted)",
        )
        # No runner required, or this one (none if it has no name: NULL matches no run).
        for pin in ("''", "NULLIF((SELECT name FROM runner), '')")
    ]
    # The runner is heard first: its row locked and its heartbeat written, as ``_heard``
    # does. Its row as the statement's snapshot saw it (``seen``) and as locked (the
    # newest version, once any transaction that held it has ended) must be the same: every
    # claim writes its runner's row, so then every claim for it committed before the lock
    # is in the snapshot, and the free slots are counted right. Otherwise (``moved``) it
    # claims nothing, and is run again.
    #
    # The runs chosen are locked, then claimed, by their row versions' addresses
    # (``ctid``): a TID scan whatever the table's statistics. By primary key, a plan
    # PostgreSQL made and kept while the table was tiny (a fresh one: prepared statements
    # keep a generic plan until the next ANALYZE) scans the whole table for them, and a
    # claim costs it more the more runs there are. A run claimed (or otherwise changed)
    # since this statement's snapshot has a new version: the lock passes over it, as over
    # one another claim holds (``SKIP LOCKED``); it reads ``_READ_PAST`` runs more than it
    # wants, and locks the first it can, in claim order, up to the number it wants (a lock
    # under a LIMIT: the runs after them are not locked). One statement counts the free
    # slots (LEAST ignores a NULL: ``claim`` counts none), reads, locks and claims (one
    # round trip, one plan); beside the claimed rows it returns the runner's state, the
    # free slots it counted, how many runs it read and the last of them (alone if it
    # claimed none). The slots count the runs this one claimed before: they are held.
    # ``wanting`` is MATERIALIZED: inlined into ``wanted``, which names its ``n`` three
    # times, its CASE was planned three times over (nine subplans to start, not three).
    #
    # With ``start``, the same statement stores the runs' start commands, as
    # ``commands.append`` would after it (a round trip less a claim): numbered on from the
    # runner's row in the write that hears it (a statement may write a row once), in claim
    # order, each returned beside its run. Not if it claimed a task run: its start carries
    # its task as read after the claim (``_with_tasks``).
    numbered = ""
    stored = ""
    returned = ""
    if start is not None:
        numbered = ", next_command_idx = next_command_idx + (SELECT n FROM started)"
        stored = (
            ", started AS (SELECT CASE WHEN bool_and(task_id IS NULL) THEN COUNT(*) ELSE 0 END "
            "AS n FROM claimed), "
            "starts AS (SELECT c.id AS run_id, "
            "heard.first + row_number() OVER (ORDER BY c.priority DESC, c.created_at, c.id) "
            f"- 1 AS idx, ({start})::text AS body, c.claimed_at AS at FROM heard, claimed c "
            "WHERE (SELECT n FROM started) > 0), "
            "stored AS (INSERT INTO runner_commands (runner_id, idx, body, created_at) "
            "SELECT (SELECT id FROM runner), idx, body, at FROM starts)"
        )
        returned = "claimed.id, starts.idx AS command_idx, starts.body AS command_body"
    statement = _CLAIM_STATEMENTS[key] = (
        "WITH RECURSIVE seen AS (SELECT ctid AS version FROM runners WHERE id = ?), "
        "runner AS (SELECT ctid AS version, id, name, labels, slots, state FROM runners "
        f"WHERE id = ? {db.lock_rows()}), "
        f"heard AS (UPDATE runners SET last_heartbeat_at = ?{numbered} "
        "WHERE id = (SELECT id FROM runner) RETURNING "
        f"{'next_command_idx - (SELECT n FROM started) AS first' if start else '1'}), "
        "moved AS (SELECT (SELECT version FROM seen) IS DISTINCT FROM "
        "(SELECT version FROM runner) AS moved), "
        f"{_classes(db, '(SELECT labels FROM runner)').removeprefix('WITH RECURSIVE ')}, "
        "room AS ("
        "SELECT (SELECT CASE WHEN ? THEN slots END FROM runner) - COUNT(*) AS free FROM runs "
        f"WHERE runner_id = ? AND status IN ({HELD}) AND NOT EXISTS ("
        "SELECT 1 FROM json_to_recordset(?::json) AS ended (id text, attempts integer) "
        "WHERE ended.id = runs.id AND ended.attempts = runs.attempts)"
        "), wanting AS MATERIALIZED ("
        "SELECT CASE WHEN NOT (SELECT moved FROM moved) AND (SELECT state FROM runner) = "
        f"'{RunnerState.ACTIVE}' THEN GREATEST(0, LEAST(?::integer, (SELECT free FROM room))) "
        "ELSE 0 END AS n"
        "), wanted AS ("
        f"SELECT n, CASE WHEN n > 0 THEN n + {_READ_PAST} ELSE 0 END AS read FROM wanting"
        "), candidates AS ("
        "SELECT c.version, c.id, c.priority, c.created_at FROM fit CROSS JOIN LATERAL "
        f"({' UNION ALL '.join(f'({arm})' for arm in arms)}) AS c "
        "ORDER BY c.priority DESC, c.created_at, c.id LIMIT (SELECT read FROM wanted)"
        "), locked AS ("
        "SELECT ctid AS version, status, available_at FROM runs "
        "WHERE ctid = ANY (ARRAY (SELECT version FROM candidates)) "
        "ORDER BY priority DESC, created_at, id LIMIT (SELECT n FROM wanted) "
        f"{db.lock_rows(skip_locked=True)}"
        "), claimed AS ("
        f"{_CLAIM_SET} WHERE ctid = ANY (ARRAY (SELECT version FROM locked "
        f"WHERE status = '{RunStatus.PENDING}' AND available_at <= ?)) RETURNING *"
        "), last_read AS ("
        "SELECT id, priority, created_at, COUNT(*) OVER () AS n FROM candidates "
        "ORDER BY priority, created_at DESC, id DESC LIMIT 1"
        f"){stored} SELECT (SELECT state FROM runner) AS read_state, moved.moved AS read_moved, "
        "room.free AS read_free, wanted.n AS read_wanted, wanted.read AS read_limit, "
        "COALESCE(last_read.n, 0) AS read_n, last_read.id AS read_last_id, "
        "last_read.priority AS read_last_priority, "
        f"last_read.created_at AS read_last_created_at, {returned or 'claimed.*'} "
        "FROM moved CROSS JOIN room CROSS JOIN wanted LEFT JOIN last_read ON TRUE "
        "LEFT JOIN claimed ON TRUE"
        f"{' LEFT JOIN starts ON starts.run_id = claimed.id' if start else ''}"
    )
    return statement


# A claim's write: the run is the runner's, a new attempt (``_claim_values``' parameters).
_CLAIM_SET = (
    "UPDATE runs SET status = ?, runner_id = ?, attempts = attempts + 1, "
    "claimed_at = ?, started_at = NULL, cancel_requested = 0, updated_at = ?"
)


def _claim_values(runner_id: str, now: float) -> tuple[object, ...]:
    return (str(RunStatus.CLAIMED), runner_id, now, now)


def _set_claimed(tx: Tx, ids: list[str], runner_id: str, now: float) -> list[Run]:
    """Claim those of the runs ``ids`` that are claimable for the runner; the runs as
    written."""
    if not ids:
        return []
    return runs_from_tuples(
        *tx.named_tuples(
            f"{_CLAIM_SET} WHERE id IN ({', '.join('?' for _ in ids)}) AND {CLAIMABLE} RETURNING *",
            (*_claim_values(runner_id, now), *ids),
        )
    )


def check_not_lost(runner: Row) -> None:
    """A runner declared lost (or stopped) holds nothing any more: it must register again."""
    if runner["state"] not in ALIVE:
        raise LeaseLost(
            f"runner {runner['id']} is {runner['state']}; register again", code="runner_lost"
        )


def check_lease(row: Row, runner_id: str, attempt: int) -> None:
    if row["runner_id"] != runner_id:
        # Not the holder's id: the caller is not the one to learn it (issue 9).
        raise LeaseLost(
            f"run {row['id']} is not held by runner {runner_id} (status {row['status']})"
        )
    if row["attempts"] != attempt:
        raise LeaseLost(
            f"run {row['id']} is not held by runner {runner_id} attempt {attempt} "
            f"(it holds attempt {row['attempts']}, status {row['status']})",
        )


def reports_late(row: Row, runner_id: str, attempt: int) -> bool:
    """Is this a late report of the attempt ``runner_id`` held, that the run still takes?

    The runner's lease ran out (it was declared lost, or stopped reporting the run) and the
    run waits for that same attempt: back at pending while attempts remain, nobody having
    claimed it since (a claim counts a new attempt), or lost, with no attempt left, until
    the reconciler fails it (``reconcile.fail_lost``). Nobody else ran it, and the work the
    report tells of is the only work done for it. A cancel, a claim, the grace's end or
    another report ending it, all move it on from there, and the report is refused."""
    status = row["status"]
    waiting = status == RunStatus.LOST or (status == RunStatus.PENDING and row["runner_id"] is None)
    return bool(waiting and row["attempts"] == attempt and row["lost_runner_id"] == runner_id)


def check_reporter(row: Row, runner_id: str, attempt: int) -> None:
    """Refuse (``LeaseLost``) a report from anyone but the lease holder, or the runner
    whose lease on this attempt ran out while the run still waits for it (``reports_late``)."""
    if not reports_late(row, runner_id, attempt):
        check_lease(row, runner_id, attempt)


def leased_row(tx: Tx, run_id: str, runner_id: str, attempt: int) -> Row:
    """The run's row, locked, if this runner and attempt hold its lease, or held it and the
    run still waits for it (``reports_late``); else LeaseLost."""
    row = row_by_id(tx, "runs", run_id, lock=tx.lock)
    check_reporter(row, runner_id, attempt)
    return row
