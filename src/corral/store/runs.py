"""Runs in the store: created by clients, claimed and reported on by runners.

Each operation is one transaction. Transitions go through ``runs.check_transition`` so
the table in ``corral/runs.py`` is the only place that says what may happen. Time is
passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import corral.store.callbacks as callbacks
import corral.store.claims as claims
import corral.store.commands as commands
import corral.store.run_requests as run_requests
import corral.store.sessions as sessions
from corral.errors import InvalidRequest, LeaseLost, NotFound
from corral.ids import RunId, RunnerId
from corral.runs import (
    Ended,
    NewRun,
    Run,
    RunReport,
    RunStatus,
    after_rate_limit,
    check_transition,
    may_become,
    status_reported,
)
from corral.store.claims import Claimable, check_lease, leased_row, reports_late
from corral.store.db import Database, Row, Tx
from corral.store.rows import (
    dumps,
    insert_runs,
    new_run_row,
    row_by_id,
    run_from_row,
    runs_from_tuples,
    sql_in,
    sql_list,
    update_row,
)
from corral.store.run_requests import RunRequest
from corral.store.task_runs import apply_step, settle_task_run
from corral.subagents import Limits

# The statuses a start report moves a run from, as the transition table says (claimed).
_STARTABLE = sql_list(may_become(RunStatus.RUNNING))
# Runs as clients read them: an async_callback child with its callback's fate.
_WITH_CALLBACK = (
    "runs.*, c.delivered_run_id AS callback_run_id, c.dropped AS callback_dropped, "
    "c.child_run_id IS NOT NULL AS callback_recorded "
    "FROM runs LEFT JOIN run_callbacks c ON c.child_run_id = runs.id"
)


# A lost run's grace: its lost runner's own threshold, else the coordinator's (``?``).
GRACE_S = "COALESCE((SELECT lost_after_s FROM runners WHERE runners.id = runs.lost_runner_id), ?)"


class RunStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.subagent_limits = Limits()  # depth and fan-out of sub-agent sessions

    # ---- clients -------------------------------------------------------------------------

    def create_many(
        self, specs: Sequence[NewRun], now: float, request: RunRequest | None = None
    ) -> list[Run]:
        """Write new runs, all or none: a sub-agent's parent is checked in the same
        transaction (``callbacks.check_children``). ``request``: its idempotency key; sent
        again, the runs it created then, as they are now (``run_requests``)."""
        rows = [new_run_row(spec, now) for spec in specs]
        with self.db.transaction() as tx:
            if request is not None:
                created = run_requests.take(tx, request, [r["id"] for r in rows], now)
                if created is not None:
                    return self._read(tx, created)
            callbacks.check_children(tx, self.db, rows, self.subagent_limits)
            return insert_runs(tx, rows, self.db.dialect)

    def _read(self, tx: Tx, run_ids: Sequence[str]) -> list[Run]:
        """The runs, in ``run_ids``' order (a run deleted since is left out)."""
        marks = ", ".join("?" for _ in run_ids)
        rows = tx.execute(f"SELECT {_WITH_CALLBACK} WHERE runs.id IN ({marks})", tuple(run_ids))
        by_id = {row["id"]: run_from_row(row) for row in rows}
        return [by_id[i] for i in run_ids if i in by_id]

    def create(self, spec: NewRun, now: float) -> Run:
        return self.create_many([spec], now)[0]

    def get(self, run_id: str) -> Run:
        """The run, with what became of the callback it owed its parent, if any."""
        with self.db.transaction(write=False) as tx:
            row = tx.one(f"SELECT {_WITH_CALLBACK} WHERE runs.id = ?", (run_id,))
        if row is None:
            raise NotFound.of("run", run_id)
        return run_from_row(row)

    def grace_ends_at(self, run_id: str, lost_after_s: float) -> float | None:
        """When a run waiting lost fails unless its runner's late report comes first (the
        reconciler's ``fail_lost``); None for a run not waiting lost. ``lost_after_s``: the
        coordinator's threshold, for a runner with none of its own."""
        with self.db.transaction(write=False) as tx:
            row = tx.one(
                f"SELECT lost_at + {GRACE_S} AS ends_at FROM runs "
                f"WHERE id = ? AND {sql_in('status', {RunStatus.LOST})}",
                (lost_after_s, run_id),
            )
        return None if row is None else float(row["ends_at"])

    def count_by_status(self) -> dict[str, int]:
        """How many runs are in each status."""
        with self.db.transaction(write=False) as tx:
            rows = tx.execute("SELECT status, COUNT(*) AS n FROM runs GROUP BY status")
        return {str(r["status"]): int(r["n"]) for r in rows}

    def request_cancel(self, run_id: str, now: float) -> Run:
        """Pending (or lost) runs are cancelled at once. A held one is flagged, and a
        ``cancel_run`` command to its runner is stored in the same transaction: the runner
        gets it as it gets any command (pushed on its socket, or in answer to its control
        poll), again after a reconnect, until it acknowledges it.

        Locks on PostgreSQL, in the order the claim, the reconciler, a heartbeat and a
        socket's reports take them: the runner's row, then the run's (the other way round,
        a cancel and the reconciler taking back the same runner's runs could deadlock). The
        run is read unlocked first to learn its runner; if it changed hands before the
        locks were taken, the transaction ends unwritten and starts over."""
        while True:
            with self.db.transaction() as tx:
                cancelled = _cancel(tx, self.db, run_id, now)
            if cancelled is not None:
                return cancelled

    # ---- runners -------------------------------------------------------------------------

    def has_claimable(self, now: float, *, since: float | None = None) -> bool:
        """Is any pending run ready to be claimed (its backoff over)? With ``since``: one
        that became so after ``since`` (written, or its backoff ended)."""
        with self.db.transaction(write=False) as tx:
            return claims.has_claimable(tx, self.db, now, since)

    def claimable(self, now: float, limit: int) -> list[Claimable]:
        """Pending runs ready to be claimed, in the order claims take them (at most
        ``limit``): what each requires of a runner. A read: waiting runners look here
        before they try a claim (a write)."""
        with self.db.transaction(write=False) as tx:
            return claims.claimable(tx, now, limit)

    def claim(self, runner_id: RunnerId, max_runs: int, now: float) -> list[Run]:
        """Atomically give up to ``max_runs`` pending runs to an active runner: the claim
        and the lease it takes are one transaction (``claims.claim``)."""
        if max_runs <= 0:
            return []
        with self.db.transaction() as tx:
            return claims.claim(tx, self.db, runner_id, max_runs, now)

    def mark_started(self, run_id: str, runner_id: str, attempt: int, now: float) -> None:
        """The runner started the attempt it holds (nothing is read back: every run starts,
        and no caller needs the row)."""
        with self.db.transaction() as tx:
            # The usual case in one statement (the lease and the old status are its guard);
            # anything else (a repeat, a lost lease) takes the checked path below.
            if _start_as_reported(tx, runner_id, [(run_id, attempt)], now):
                return
            row = leased_row(tx, run_id, runner_id, attempt)
            if row["status"] == RunStatus.RUNNING or reports_late(row, runner_id, attempt):
                return  # a repeated report (the first answer was lost), or a late one: moot
            transition(tx, row, RunStatus.RUNNING, now, started_at=now)

    def mark_started_many(
        self,
        runner_id: str,
        attempts: Sequence[tuple[str, int]],
        now: float,
        *,
        applied: int | None = None,
    ) -> set[tuple[str, int]]:
        """``mark_started``'s usual case for several (run, attempt) of one runner in one
        statement: those it started. Any other (a repeat, a lost lease) is the caller's to
        pass to ``mark_started``. ``applied``: first record the runner's events as applied
        up to it (``CommandStore.events_applied``)."""
        if not attempts and applied is None:
            return set()
        with self.db.transaction() as tx:
            if applied is not None and (not attempts or self.db.dialect != "postgres"):
                tx.execute(
                    commands.EVENTS_APPLIED, commands.events_applied_values(runner_id, applied)
                )
                applied = None
            if not attempts:
                return set()
            if applied is None:
                return _start_as_reported(tx, runner_id, attempts, now)
            # One statement. The runner's row is written (locked) before any run's: the
            # condition on ``applied`` names no run, so it is checked once, before the runs
            # are read (a gating condition), and that runs its CTE first.
            return _start_as_reported(
                tx,
                runner_id,
                attempts,
                now,
                before=(
                    f"WITH applied AS ({commands.EVENTS_APPLIED} RETURNING 1) ",
                    "(SELECT COUNT(*) FROM applied) >= 0 AND ",
                    commands.events_applied_values(runner_id, applied),
                ),
            )

    def record_session(
        self, run_id: str, runner_id: str, attempt: int, session_id: str, now: float
    ) -> Run:
        """The agent announced its session id: remember it before the run ends."""
        with self.db.transaction() as tx:
            row = leased_row(tx, run_id, runner_id, attempt)
            tx.execute(
                "UPDATE runs SET session_id = ?, updated_at = ? WHERE id = ?",
                (session_id, now, run_id),
            )
            row = {**row, "session_id": session_id}
            sessions.upsert_from_run(tx, row, now)
            return run_from_row(row)

    def record_result(
        self, run_id: str, runner_id: str, attempt: int, result: str, now: float
    ) -> Run:
        """The result of an attempt, told before the attempt ends (the seed system's runner
        posts it as a session event; its completion report carries none)."""
        with self.db.transaction() as tx:
            row = leased_row(tx, run_id, runner_id, attempt)
            if not RunStatus(row["status"]).holds_lease:
                check_transition(run_id, RunStatus(row["status"]), RunStatus.RUNNING)  # raises
            tx.execute(
                "UPDATE runs SET result = ?, updated_at = ? WHERE id = ?", (result, now, run_id)
            )
            return run_from_row({**row, "result": result, "updated_at": now})

    def finish(
        self, run_id: str, runner_id: str, attempt: int, report: RunReport, now: float
    ) -> Run:
        """Record how an attempt ended; only the runner and attempt holding the lease may —
        or, late, the runner whose lease on that attempt ran out while the run still waits
        for it (``reports_late``): at pending, unclaimed since (done work is not run again),
        or lost in its grace, no attempt left (done work is not recorded as failed)."""
        with self.db.transaction() as tx:
            if report.status is not RunStatus.PENDING:
                # The usual case in one statement, as ``mark_started``; anything else (a
                # repeat, a lost lease, a late report, a failure after a cancel) takes the
                # checked path.
                ended = _end_as_reported(tx, runner_id, [(run_id, attempt, report)], now)
                if ended:
                    return ended[run_id, attempt]
            row = row_by_id(tx, "runs", run_id, lock=self.db.lock_rows())
            status = status_reported(report.status, bool(row["cancel_requested"]))
            same_lease = row["runner_id"] == runner_id and row["attempts"] == attempt
            if same_lease and RunStatus(row["status"]).is_terminal and row["status"] == status:
                return run_from_row(row)  # a repeated report (the first answer was lost)
            late = reports_late(row, runner_id, attempt)
            if late and report.status is RunStatus.PENDING:
                return run_from_row(row)  # giving back late what was taken back: moot
            if not late:
                check_lease(row, runner_id, attempt)
            fields: dict[str, Any] = {
                "exit_code": report.exit_code,
                "error": report.error,
                "result": report.result,
                # A task run's agent reported its cost with its step: a report without one
                # (a git step failed after the agent) keeps it.
                "cost_usd": report.cost_usd if report.cost_usd is not None else row["cost_usd"],
                "usage": dumps(report.usage) if report.usage is not None else None,
                "num_turns": report.num_turns,
            }
            if report.session_id:
                fields["session_id"] = report.session_id
            if report.status is RunStatus.PENDING:
                return _given_back(tx, row, report, fields, now)
            if late:
                fields["runner_id"] = runner_id  # the run ends as it ran: on that runner
            run = transition(
                tx,
                row,
                status,
                now,
                task_outcome=report.task,
                reported=True,
                late=late,
                finished_at=now,
                **fields,
            )
            if run.session_id:
                sessions.finish_from_run(tx, run, now)
            return run

    def finish_many(
        self, runner_id: str, finals: Sequence[tuple[str, int, RunReport]], now: float
    ) -> dict[tuple[str, int], Run | Ended]:
        """``finish``'s usual case for several final reports (run, attempt, report) of one
        runner, those with the same outcome in one statement (a runner's runs mostly end
        alike: exit 0 and nothing more): the runs it ended, by (run, attempt) — a plain run
        as ``Ended``, not read back whole (``_end_alike``). Any other (a run given back, a
        repeat, a lost lease, a failure after a cancel) is the caller's to pass to
        ``finish``."""
        alike: dict[tuple[tuple[str, Any], ...], list[tuple[str, int, RunReport]]] = {}
        for final in finals:
            if final[2].status is not RunStatus.PENDING:
                alike.setdefault(tuple(_ended_fields(final[2]).items()), []).append(final)
        ended: dict[tuple[str, int], Run | Ended] = {}
        with self.db.transaction() as tx:
            for ends in alike.values():
                ended.update(_end_alike(tx, runner_id, ends, now))
        return ended

    def record_task_step(
        self,
        run_id: str,
        runner_id: str,
        attempt: int,
        step: str,
        data: dict[str, Any],
        now: float,
    ) -> None:
        """A task run finished a step of its attempt (worktree, agent, commit, merge)."""
        with self.db.transaction() as tx:
            row = leased_row(tx, run_id, runner_id, attempt)
            if not row["task_id"]:
                raise InvalidRequest(f"run {run_id} is not a task run")
            apply_step(tx, tx.lock, row, step, data, now)

    def list(
        self,
        *,
        statuses: Iterable[RunStatus] = (),
        runner_id: str | None = None,
        session: str | None = None,
        before: str | None = None,
        limit: int = 50,
    ) -> list[Run]:
        """Newest first; ``before`` is the id of the last run of the previous page."""
        where: list[str] = []
        params: list[Any] = []
        status_list = [str(s) for s in statuses]
        if status_list:
            where.append(f"status IN ({', '.join('?' for _ in status_list)})")
            params += status_list
        if runner_id:
            where.append("runner_id = ?")
            params.append(runner_id)
        if session:
            where.append("(session_id = ? OR session_name = ?)")
            params += [session, session]
        with self.db.transaction(write=False) as tx:
            if before:
                anchor = row_by_id(tx, "runs", before)
                where.append("(created_at < ? OR (created_at = ? AND id < ?))")
                params += [anchor["created_at"], anchor["created_at"], anchor["id"]]
            clause = f"WHERE {' AND '.join(where)}" if where else ""
            rows = tx.execute(
                f"SELECT {_WITH_CALLBACK} {clause} ORDER BY created_at DESC, id DESC LIMIT ?",
                [*params, limit],
            )
        return [run_from_row(r) for r in rows]


def _cancel(tx: Tx, db: Database, run_id: str, now: float) -> Run | None:
    """One try of ``RunStore.request_cancel``; None: the run changed hands meanwhile."""
    seen = row_by_id(tx, "runs", run_id)
    runner_id = seen["runner_id"] if RunStatus(seen["status"]).holds_lease else None
    if runner_id is not None:
        tx.one(f"SELECT id FROM runners WHERE id = ? {db.lock_rows()}", (runner_id,))
    row = row_by_id(tx, "runs", run_id, lock=db.lock_rows())
    status = RunStatus(row["status"])
    if status.holds_lease and row["runner_id"] != runner_id:
        return None  # claimed (or claimed again) since it was read: its runner is not locked
    if status in (RunStatus.PENDING, RunStatus.LOST):
        return transition(tx, row, RunStatus.CANCELLED, now, error="cancelled", finished_at=now)
    if status is RunStatus.CANCELLED:
        return run_from_row(row)  # cancelled before: a cancel sent again changes nothing
    if not status.holds_lease:
        check_transition(run_id, status, RunStatus.CANCELLED)  # raises: it has ended
    if row["cancel_requested"]:
        return run_from_row(row)  # asked before: its command is stored already
    flagged = update_row(tx, "runs", run_id, now, cancel_requested=1)
    assert flagged is not None  # the row is locked
    commands.append(tx, db, row["runner_id"], [{"type": "cancel_run", "run_id": run_id}], now)
    return run_from_row(flagged)


def _start_as_reported(
    tx: Tx,
    runner_id: str,
    attempts: Sequence[tuple[str, int]],
    now: float,
    before: tuple[str, str, Sequence[object]] = ("", "", ()),
) -> set[tuple[str, int]]:
    """Start the runs (run, attempt) this runner holds and has not started yet, in one
    statement guarded by the lease and the old status: those it started. ``before``: a
    WITH clause, a first condition and their parameters (``RunStore.mark_started_many``)."""
    with_clause, condition, params = before
    started = tx.tuples(  # not a dict a row: (id, attempts) is all it reads
        f"{with_clause}UPDATE runs SET status = ?, started_at = ?, updated_at = ? "
        f"WHERE {condition}id IN ({', '.join('?' for _ in attempts)}) "
        f"AND status IN ({_STARTABLE}) "
        # As in ``_ending``: the runner matched with each id, found by primary key.
        f"AND (id, attempts, runner_id) IN (VALUES {', '.join('(?, ?, ?)' for _ in attempts)}) "
        "RETURNING id, attempts",
        (
            *params,
            str(RunStatus.RUNNING),
            now,
            now,
            *(run_id for run_id, _ in attempts),
            *(x for run_id, attempt in attempts for x in (run_id, attempt, runner_id)),
        ),
    )
    return {(run_id, attempt) for run_id, attempt in started}


def _ended_fields(report: RunReport) -> dict[str, Any]:
    """The columns a final report taken as it is sets, besides its time."""
    fields: dict[str, Any] = {
        "status": str(report.status),
        "exit_code": report.exit_code,
        "error": report.error,
        "result": report.result,
        "usage": dumps(report.usage) if report.usage is not None else None,
        "num_turns": report.num_turns,
    }
    if report.cost_usd is not None:  # a report without one keeps its task step's cost
        fields["cost_usd"] = report.cost_usd
    if report.session_id:
        fields["session_id"] = report.session_id
    return fields


def _end_as_reported(
    tx: Tx, runner_id: str, ends: Sequence[tuple[str, int, RunReport]], now: float
) -> dict[tuple[str, int], Run]:
    """``finish`` for final reports (run, attempt, report) of one runner that the runs take
    as they are, all with the first one's outcome (``_ended_fields``), in one statement
    (``_ending``): the runs it ended, by run and attempt, as written. Those the statement
    leaves out are not among them, for the checked path."""
    sql, params = _ending(runner_id, ends, now)
    names, rows = tx.named_tuples(f"{sql} RETURNING *", params)
    written: dict[str, Run] = {run.id: run for run in runs_from_tuples(names, rows)}
    ended: dict[tuple[str, int], Run] = {}
    for run_id, attempt, report in ends:  # in the reports' order
        if (run := written.pop(run_id, None)) is None:  # once: a repeat is the checked path's
            continue
        _after_ending(tx, run, report, now)
        ended[run_id, attempt] = run
    return ended


def _end_alike(
    tx: Tx, runner_id: str, ends: Sequence[tuple[str, int, RunReport]], now: float
) -> dict[tuple[str, int], Run | Ended]:
    """``_end_as_reported`` for ``finish_many``: a run its report ended is read back whole
    only if its end moves more than itself (a task, a session, a parent owed a callback:
    ``_after_ending``), else as ``Ended`` — a run's 37 columns read back and made a ``Run``
    cost the store writer more than the update that ended it."""
    sql, params = _ending(runner_id, ends, now)
    written = {
        run_id: (status, more)
        for run_id, status, more in tx.tuples(
            f"{sql} RETURNING id, status, "
            "task_id IS NOT NULL OR session_id IS NOT NULL OR callback IS NOT NULL",
            params,
        )
    }
    moving = [run_id for run_id, (_, more) in written.items() if more]
    whole: dict[str, Run] = {}
    if moving:  # read in the same transaction: as the update wrote them
        names, rows = tx.named_tuples(
            f"SELECT * FROM runs WHERE id IN ({', '.join('?' for _ in moving)})", moving
        )
        whole = {run.id: run for run in runs_from_tuples(names, rows)}
    ended: dict[tuple[str, int], Run | Ended] = {}
    for run_id, attempt, report in ends:  # in the reports' order
        if (status_more := written.pop(run_id, None)) is None:  # once, as in _end_as_reported
            continue
        if (run := whole.get(run_id)) is not None:
            _after_ending(tx, run, report, now)
            ended[run_id, attempt] = run
        else:
            ended[run_id, attempt] = Ended(RunId(run_id), _RUN_STATUSES[status_more[0]])
    return ended


def _ending(
    runner_id: str, ends: Sequence[tuple[str, int, RunReport]], now: float
) -> tuple[str, tuple[Any, ...]]:
    """The update (without RETURNING) and its parameters that end the runs of ``ends`` as
    their first report says, in one statement: the lease and the statuses the transition
    table lets a run leave for the reported one are its guard. A failure counts as a
    cancel when one was asked (``status_reported``): that case, and any other the guard
    leaves out, it does not end."""
    report = ends[0][2]
    fields = {**_ended_fields(report), "finished_at": now, "updated_at": now}
    not_cancelled = " AND cancel_requested = 0" if report.status is RunStatus.FAILED else ""
    sql = (
        f"UPDATE runs SET {', '.join(f'{name} = ?' for name in fields)} "
        f"WHERE id IN ({', '.join('?' for _ in ends)}) "
        f"AND status IN ({_LEAVE_FOR[report.status]}){not_cancelled} "
        # Each run's attempt and runner matched with its id: a term ``runner_id = ?`` of its
        # own lets SQLite find the runs through runs_held, an index this update changes, at
        # twice the cost of finding them by primary key.
        f"AND (id, attempts, runner_id) IN (VALUES {', '.join('(?, ?, ?)' for _ in ends)})"
    )
    params = (
        *fields.values(),
        *(run_id for run_id, _, _ in ends),
        *(x for run_id, attempt, _ in ends for x in (run_id, attempt, runner_id)),
    )
    return sql, params


def _after_ending(tx: Tx, run: Run, report: RunReport, now: float) -> None:
    """What ``transition`` does after its update, for a run ended by its runner's report."""
    callbacks.record(tx, run, now)
    if run.task_id:
        settle_task_run(tx, tx.lock, run, report.task, now)
    if run.session_id:
        sessions.finish_from_run(tx, run, now)


_RUN_STATUSES = {str(status): status for status in RunStatus}


# For each status a run may end in: the statuses the transition table lets it leave for it.
_LEAVE_FOR = {status: sql_list(may_become(status)) for status in RunStatus if status.is_terminal}


def transition(
    tx: Tx,
    row: Row,
    new: RunStatus,
    now: float,
    task_outcome: dict[str, Any] | None = None,
    reported: bool = False,
    late: bool = False,
    **fields: Any,
) -> Run:
    """Move one run to ``new`` if the transition table allows it; guarded by its old status.

    A task's run that ends, however it ends (reported, lost for good, timed out,
    cancelled), moves its task on in the same transaction. ``reported``: the runner's final
    report ends it (its session is brought up to date by the caller); a run ended any other
    way still adds the cost it recorded before (a task's agent step) to its session.
    ``late``: a late final report ends it (``LATE_REPORT``; the caller checked
    ``reports_late``)."""
    old = RunStatus(row["status"])
    check_transition(row["id"], old, new, late=late)
    updated = update_row(
        tx, "runs", row["id"], now, only_if={"status": str(old)}, **fields, status=str(new)
    )
    if updated is None:  # cannot happen under the row lock; refuse rather than guess
        raise LeaseLost(f"run {row['id']} changed under us")
    run = run_from_row(updated)
    if new.is_terminal:
        callbacks.record(tx, run, now)  # an async_callback child owes its parent a resume
    if new.is_terminal and not reported and run.session_id and run.cost_usd:
        sessions.add_cost(tx, run.session_id, run.cost_usd, now)
    if run.task_id and new.is_terminal:
        settle_task_run(tx, tx.lock, run, task_outcome, now)
    return run


def _given_back(tx: Tx, row: Row, report: RunReport, fields: dict[str, Any], now: float) -> Run:
    """The runner gave the attempt back, rate limited: the run waits for ``retry_after_s``
    and runs again, or fails once it was given back too often, or ends cancelled if a
    cancel was asked (``after_rate_limit``)."""
    after = after_rate_limit(row["rate_limited"], cancel_requested=bool(row["cancel_requested"]))
    if after is RunStatus.CANCELLED:
        error = f"cancelled (its runner gave the attempt back: {report.error or report.result})"
        return transition(
            tx, row, RunStatus.CANCELLED, now, finished_at=now, **{**fields, "error": error}
        )
    if after is RunStatus.FAILED:
        return transition(
            tx,
            row,
            RunStatus.FAILED,
            now,
            finished_at=now,
            **{
                **fields,
                "error": f"rate limited {row['rate_limited'] + 1} times: "
                f"{report.error or report.result}",
            },
        )
    return transition(
        tx,
        row,
        RunStatus.PENDING,
        now,
        rate_limited=row["rate_limited"] + 1,
        available_at=now + (report.retry_after_s or 0.0),
        runner_id=None,
        lost_runner_id=None,  # given back, not taken: no late report is to come
        error=report.error or report.result,
        session_id=fields.get("session_id", row["session_id"]),
    )
