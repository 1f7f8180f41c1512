"""The store's domain operations: every state change of runs, runners and sessions.

Each operation is one transaction. Transitions go through ``runs.check_transition`` so
the table in ``runs.py`` is the only place that says what may happen. Time is passed in.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.errors import Forbidden, InvalidRequest, LeaseLost, NotFound
from corral.ids import RunId, RunnerId, new_runner_id
from corral.runners import Runner, RunnerState
from corral.runs import NewRun, Run, RunReport, RunStatus, check_transition
from corral.sessions import Session
from corral.store.actors import ActorStore
from corral.store.db import Database, Row, Tx, open_database
from corral.store.link import LinkStore
from corral.store.pools import PoolStore
from corral.store.retention import Collected, Retention, collect
from corral.store.rows import (
    dumps,
    new_run_row,
    row_by_id,
    run_from_row,
    runner_from_row,
    session_from_row,
)
from corral.store.tasks import TaskStore, apply_step, settle_task_run
from corral.store.tokens import TokenStore

# A rate-limited run gives its attempt back this many times, then fails.
MAX_RATE_LIMIT_REQUEUES = 20


@dataclass(frozen=True)
class LogLine:
    line_no: int
    stream: str
    text: str
    ts: float


@dataclass(frozen=True)
class LogEntry:
    id: int
    attempt: int
    line_no: int
    stream: str
    text: str
    ts: float


@dataclass(frozen=True)
class Held:
    """A run a runner says it is working on."""

    run_id: RunId
    attempt: int


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


@dataclass(frozen=True)
class RunnerSync:
    """What a runner must do after telling the store what it holds."""

    cancel: list[RunId] = field(default_factory=list)  # still yours, but cancel it
    abandon: list[RunId] = field(default_factory=list)  # no longer yours: stop it, report nothing


@dataclass(frozen=True)
class Reconciled:
    lost_runners: list[RunnerId] = field(default_factory=list)
    requeued: list[RunId] = field(default_factory=list)
    failed: list[RunId] = field(default_factory=list)
    timed_out: list[RunId] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.lost_runners or self.requeued or self.failed or self.timed_out)


class Store:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.tasks = TaskStore(db)
        self.tokens = TokenStore(db)
        self.link = LinkStore(self)
        self.actors = ActorStore(db, self.link.push)
        self.pools = PoolStore(db)
        self.actors.is_serverless = self.pools.is_serverless

    @classmethod
    def open(cls, url: str) -> Store:
        return cls(open_database(url))

    def close(self) -> None:
        self.db.close()

    def collect_garbage(self, retention: Retention, now: float) -> Collected:
        """Delete finished work older or larger than ``retention`` allows (``retention.py``)."""
        return collect(self.db, retention, now)

    # ---- runs: clients -------------------------------------------------------------------

    def create_runs(self, specs: Sequence[NewRun], now: float) -> list[Run]:
        rows = [new_run_row(spec, now) for spec in specs]
        columns = list(rows[0]) if rows else []
        sql = f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
        with self.db.transaction() as tx:
            tx.many(sql, [list(row.values()) for row in rows])
        return [run_from_row({**row, "exit_code": None}) for row in rows]

    def create_run(self, spec: NewRun, now: float) -> Run:
        return self.create_runs([spec], now)[0]

    def get_run(self, run_id: str) -> Run:
        with self.db.transaction(write=False) as tx:
            return run_from_row(row_by_id(tx, "runs", run_id))

    def list_runs(
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
                f"SELECT * FROM runs {clause} ORDER BY created_at DESC, id DESC LIMIT ?",
                [*params, limit],
            )
        return [run_from_row(r) for r in rows]

    def has_claimable(self, now: float, *, since: float | None = None) -> bool:
        """Is any pending run ready to be claimed (its backoff over)? With ``since``: one
        that became so after ``since`` (written, or its backoff ended)."""
        sql = "SELECT 1 AS x FROM runs WHERE status = 'pending' AND available_at <= ?"
        params: tuple[float, ...] = (now,)
        if since is not None:
            sql += " AND (available_at > ? OR updated_at > ?)"
            params += (since, since)
        with self.db.transaction(write=False) as tx:
            row = tx.one(sql + " LIMIT 1", params)
        return row is not None

    def claimable(self, now: float, limit: int) -> list[Claimable]:
        """Pending runs ready to be claimed, in the order claims take them (at most
        ``limit``): what each requires of a runner. A read: waiting runners look here
        before they try a claim (a write)."""
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                "SELECT id, required_runner, labels FROM runs "
                "WHERE status = 'pending' AND available_at <= ? "
                "ORDER BY priority DESC, created_at, id LIMIT ?",
                (now, limit),
            )
        return [
            Claimable(RunId(r["id"]), r["required_runner"], frozenset(json.loads(r["labels"])))
            for r in rows
        ]

    def schema_version(self) -> int:
        """The newest migration applied to this database."""
        with self.db.transaction(write=False) as tx:
            row = tx.one("SELECT MAX(version) AS v FROM schema_migrations")
        return int(row["v"]) if row and row["v"] is not None else 0

    def count_runs(self) -> dict[str, int]:
        """How many runs are in each status."""
        with self.db.transaction(write=False) as tx:
            rows = tx.execute("SELECT status, COUNT(*) AS n FROM runs GROUP BY status")
        return {str(r["status"]): int(r["n"]) for r in rows}

    def request_cancel(self, run_id: str, now: float) -> Run:
        """Pending runs are cancelled at once; held ones are flagged for their runner to stop."""
        with self.db.transaction() as tx:
            row = row_by_id(tx, "runs", run_id, lock=self.db.lock_rows())
            status = RunStatus(row["status"])
            if status in (RunStatus.PENDING, RunStatus.LOST):
                _transition(tx, row, RunStatus.CANCELLED, now, error="cancelled", finished_at=now)
            elif status.holds_lease:
                tx.execute(
                    "UPDATE runs SET cancel_requested = 1, updated_at = ? WHERE id = ?",
                    (now, run_id),
                )
            else:
                check_transition(run_id, status, RunStatus.CANCELLED)  # raises: terminal
            return run_from_row(row_by_id(tx, "runs", run_id))

    # ---- runs: runners -------------------------------------------------------------------

    def claim_runs(self, runner_id: RunnerId, max_runs: int, now: float) -> list[Run]:
        """Atomically give up to ``max_runs`` pending runs to an active runner.

        The claim and the lease it takes (runner id, attempt number) are one transaction.
        On PostgreSQL, ``FOR UPDATE SKIP LOCKED`` makes concurrent claimers pass over each
        other's rows; the seemingly equivalent single ``UPDATE … WHERE id = (SELECT … LIMIT
        1)`` double-claims there under concurrency. On SQLite the immediate transaction
        holds the one write lock, so the same select-then-update is safe.
        """
        if max_runs <= 0:
            return []
        with self.db.transaction() as tx:
            return self._claim(tx, runner_id, max_runs, now)

    def _claim(
        self,
        tx: Tx,
        runner_id: str,
        max_runs: int | None,
        now: float,
        finishing: Collection[tuple[str, int]] = (),
    ) -> list[Run]:
        """The claim itself, in the caller's transaction; ``None``: fill the free slots.
        ``finishing``: (run, attempt) the runner has reported ended, in reports not yet
        applied — their slots are free on the runner though the store still counts them."""
        # Locked, so a reconciler cannot declare the runner lost (and take back what it
        # holds) between this check and the commit, stranding the new claim.
        runner = row_by_id(tx, "runners", runner_id, lock=self.db.lock_rows())
        _check_not_lost(runner)
        if runner["state"] != RunnerState.ACTIVE:
            return []  # draining: it finishes what it has and takes nothing new
        if max_runs is None:
            held = tx.execute(
                "SELECT id, attempts FROM runs WHERE runner_id = ? "
                "AND status IN ('claimed', 'running')",
                (runner_id,),
            )
            busy = sum((r["id"], r["attempts"]) not in finishing for r in held)
            max_runs = runner["slots"] - busy
            if max_runs <= 0:
                return []
        # Labels are matched in SQL: runs this runner cannot take never hide ones it can.
        candidates = tx.execute(
            "SELECT id FROM runs WHERE status = 'pending' AND available_at <= ? "
            "AND (required_runner IS NULL OR required_runner = ?) "
            f"AND {self.db.json_subset('labels')} "
            "ORDER BY priority DESC, created_at, id LIMIT ? " + self.db.lock_rows(skip_locked=True),
            (now, runner["name"], runner["labels"], max_runs),
        )
        chosen = [c["id"] for c in candidates]
        if not chosen:
            return []
        rows = tx.execute(
            "UPDATE runs SET status = 'claimed', runner_id = ?, attempts = attempts + 1, "
            "claimed_at = ?, started_at = NULL, cancel_requested = 0, updated_at = ? "
            f"WHERE id IN ({', '.join('?' for _ in chosen)}) AND status = 'pending' "
            "RETURNING *",
            (runner_id, now, now, *chosen),
        )
        runs = [run_from_row(r) for r in rows]
        runs.sort(key=lambda r: (-r.priority, r.created_at, r.id))
        return runs

    def cancel_requests(self, runner_id: str) -> list[RunId]:
        """Runs this runner holds that a client asked to cancel."""
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                "SELECT id FROM runs WHERE runner_id = ? AND status IN ('claimed', 'running') "
                "AND cancel_requested = 1",
                (runner_id,),
            )
        return [RunId(r["id"]) for r in rows]

    def mark_started(self, run_id: str, runner_id: str, attempt: int, now: float) -> Run:
        with self.db.transaction() as tx:
            # The usual case in one statement (the lease and the old status are its guard);
            # anything else (a repeat, a lost lease) takes the checked path below.
            started = tx.one(
                "UPDATE runs SET status = 'running', started_at = ?, updated_at = ? "
                "WHERE id = ? AND runner_id = ? AND attempts = ? AND status = 'claimed' "
                "RETURNING *",
                (now, now, run_id, runner_id, attempt),
            )
            if started is not None:
                return run_from_row(started)
            row = _leased_row(tx, self.db, run_id, runner_id, attempt)
            if row["status"] == RunStatus.RUNNING:
                return run_from_row(row)  # a repeated report (the first answer was lost)
            return _transition(tx, row, RunStatus.RUNNING, now, started_at=now)

    def record_session(
        self, run_id: str, runner_id: str, attempt: int, session_id: str, now: float
    ) -> Run:
        """The agent announced its session id: remember it before the run ends."""
        with self.db.transaction() as tx:
            row = _leased_row(tx, self.db, run_id, runner_id, attempt)
            tx.execute(
                "UPDATE runs SET session_id = ?, updated_at = ? WHERE id = ?",
                (session_id, now, run_id),
            )
            row = {**row, "session_id": session_id}
            _upsert_session(tx, row, now)
            return run_from_row(row)

    def record_result(
        self, run_id: str, runner_id: str, attempt: int, result: str, now: float
    ) -> Run:
        """The result of an attempt, told before the attempt ends (the seed system's runner
        posts it as a session event; its completion report carries none)."""
        with self.db.transaction() as tx:
            row = _leased_row(tx, self.db, run_id, runner_id, attempt)
            if not RunStatus(row["status"]).holds_lease:
                check_transition(run_id, RunStatus(row["status"]), RunStatus.RUNNING)  # raises
            tx.execute(
                "UPDATE runs SET result = ?, updated_at = ? WHERE id = ?", (result, now, run_id)
            )
            return run_from_row({**row, "result": result, "updated_at": now})

    def finish_run(
        self, run_id: str, runner_id: str, attempt: int, report: RunReport, now: float
    ) -> Run:
        """Record how an attempt ended; only the runner and attempt holding the lease may."""
        with self.db.transaction() as tx:
            row = row_by_id(tx, "runs", run_id, lock=self.db.lock_rows())
            status = report.status
            if row["cancel_requested"] and status is RunStatus.FAILED:
                status = RunStatus.CANCELLED  # the failure is how the requested cancel showed
            same_lease = row["runner_id"] == runner_id and row["attempts"] == attempt
            if same_lease and RunStatus(row["status"]).is_terminal and row["status"] == status:
                return run_from_row(row)  # a repeated report (the first answer was lost)
            _check_lease(row, runner_id, attempt)
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
                return _requeue_after_rate_limit(tx, row, report, fields, now)
            run = _transition(
                tx,
                row,
                status,
                now,
                task_outcome=report.task,
                reported=True,
                finished_at=now,
                **fields,
            )
            if run.session_id:
                _finish_session(tx, run, now)
            return run

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
            row = _leased_row(tx, self.db, run_id, runner_id, attempt)
            if not row["task_id"]:
                raise InvalidRequest(f"run {run_id} is not a task run")
            apply_step(tx, tx.lock, row, step, data, now)

    def append_logs(
        self, run_id: str, runner_id: str, attempt: int, lines: Sequence[LogLine]
    ) -> int:
        """Store output lines; a line sent twice (a retried batch) is stored once."""
        if not lines:
            return 0
        with self.db.transaction() as tx:
            row = row_by_id(tx, "runs", run_id)
            if row["runner_id"] != runner_id:
                raise LeaseLost(f"run {run_id} is not held by runner {runner_id}")
            tx.many(
                "INSERT INTO run_logs (run_id, attempt, line_no, stream, text, ts) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, attempt, line_no) DO NOTHING",
                [(run_id, attempt, x.line_no, x.stream, x.text, x.ts) for x in lines],
            )
        return len(lines)

    def read_logs(self, run_id: str, after_id: int = 0, limit: int = 1000) -> list[LogEntry]:
        with self.db.transaction(write=False) as tx:
            row_by_id(tx, "runs", run_id)
            rows = tx.execute(
                "SELECT id, attempt, line_no, stream, text, ts FROM run_logs "
                "WHERE run_id = ? AND id > ? ORDER BY id LIMIT ?",
                (run_id, after_id, limit),
            )
        return [LogEntry(**r) for r in rows]

    # ---- runners -------------------------------------------------------------------------

    def register_runner(
        self,
        *,
        name: str,
        hostname: str,
        labels: Sequence[str],
        slots: int,
        version: str,
        transport: str,
        now: float,
        runner_id: str | None = None,
        held: Sequence[Held] | None = (),
        lost_after_s: float | None = None,
        revive: bool = True,
        token_id: str | None = None,
    ) -> tuple[Runner, RunnerSync]:
        """Register a new runner, or bring back a known one (after a network cut or a
        coordinator restart) and tell it which of the runs it still holds are its own.

        ``held=None``: the runner's link replays its own state (WebSocket), nothing to sync.
        ``lost_after_s``: its own silence threshold (else the coordinator's).
        ``revive=False``: a runner declared lost or stopped comes back as a new runner (the
        WebSocket link: its runs were taken back, so the commands and events numbered for
        its old identity are void, and a new id tells the runner to stop and start over).
        ``token_id``: the token it called with; a runner id belongs to the token that first
        registered it, and another token naming it is refused (``runner_not_yours``).
        Checked in this transaction: a reconciler cannot declare it lost in between."""
        if slots < 1:
            raise InvalidRequest("a runner needs at least one slot")
        with self.db.transaction() as tx:
            known = runner_id and tx.one(
                f"SELECT id, state, token_id FROM runners WHERE id = ? {self.db.lock_rows()}",
                (runner_id,),
            )
            if known and token_id is not None:
                _check_owner(known, token_id)
            if known and not revive and known["state"] in (RunnerState.LOST, RunnerState.STOPPED):
                known = None
            values = (
                name,
                hostname,
                dumps(list(labels)),
                slots,
                version,
                transport,
                now,
                lost_after_s,
            )
            if known:
                tx.execute(
                    "UPDATE runners SET name = ?, hostname = ?, labels = ?, slots = ?, "
                    "version = ?, transport = ?, last_heartbeat_at = ?, lost_after_s = ?, "
                    "token_id = COALESCE(token_id, ?), "
                    "state = 'active', drain_at = NULL, stopped_at = NULL WHERE id = ?",
                    (*values, token_id, runner_id),
                )
                rid = RunnerId(str(runner_id))
            else:
                rid = new_runner_id()
                tx.execute(
                    "INSERT INTO runners (id, name, hostname, labels, slots, version, transport, "
                    "last_heartbeat_at, lost_after_s, registered_at, token_id, state) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'active')",
                    (rid, *values, now, token_id),
                )
            sync = (
                RunnerSync()
                if held is None
                else _sync_held(tx, rid, held, now, self.db.lock_rows())
            )
            return runner_from_row(row_by_id(tx, "runners", rid)), sync

    def heartbeat(self, runner_id: str, held: Sequence[Held] | None, now: float) -> RunnerSync:
        """A runner is alive and holds ``held``; raises NotFound for an unknown runner and
        ``runner_lost`` if it was declared lost (it must register again).

        ``held=None``: the runner did not say what it holds (the seed's heartbeat is only
        ``{runner_id}``). Not saying is not "nothing": its leases are kept alive and none of
        its runs is touched; only an explicit list is reconciled."""
        with self.db.transaction() as tx:
            row = row_by_id(tx, "runners", runner_id, lock=self.db.lock_rows())
            _check_not_lost(row)
            tx.execute("UPDATE runners SET last_heartbeat_at = ? WHERE id = ?", (now, runner_id))
            if held is None:
                return RunnerSync()
            return _sync_held(tx, RunnerId(runner_id), held, now, self.db.lock_rows())

    def runner_token(self, runner_id: str) -> str | None:
        """The id of the token the runner registered with (None: registered before tokens,
        or by an internal caller); ``runner_not_found`` if there is no such runner."""
        with self.db.transaction(write=False) as tx:
            row = tx.one("SELECT token_id FROM runners WHERE id = ?", (runner_id,))
        if row is None:
            raise NotFound.of("runner", runner_id)
        token_id: str | None = row["token_id"]
        return token_id

    def touch_runners(self, runner_ids: Sequence[str], now: float) -> None:
        """Heartbeats of connected runners (their pings), written in one statement."""
        if runner_ids:
            with self.db.transaction() as tx:
                tx.execute(
                    "UPDATE runners SET last_heartbeat_at = ? "
                    f"WHERE id IN ({', '.join('?' for _ in runner_ids)}) "
                    "AND state IN ('active', 'draining')",
                    (now, *runner_ids),
                )

    def set_runner_state(self, runner_id: str, state: RunnerState, now: float) -> Runner:
        with self.db.transaction() as tx:
            row_by_id(tx, "runners", runner_id, lock=self.db.lock_rows())
            tx.execute(
                "UPDATE runners SET state = ?, "
                "drain_at = CASE WHEN ? = 'draining' THEN ? ELSE drain_at END, "
                "stopped_at = CASE WHEN ? = 'stopped' THEN ? ELSE stopped_at END WHERE id = ?",
                (state, state, now, state, now, runner_id),
            )
            if state is RunnerState.STOPPED:
                _release_runner_runs(
                    tx, RunnerId(runner_id), now, "runner stopped", self.db.lock_rows()
                )
            return runner_from_row(row_by_id(tx, "runners", runner_id))

    def get_runner(self, runner_id: str) -> Runner:
        with self.db.transaction(write=False) as tx:
            return runner_from_row(row_by_id(tx, "runners", runner_id))

    def list_runners(self) -> list[Runner]:
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                "SELECT r.*, (SELECT COUNT(*) FROM runs WHERE runs.runner_id = r.id "
                "AND runs.status IN ('claimed', 'running')) AS slots_used "
                "FROM runners r ORDER BY r.registered_at DESC"
            )
        return [runner_from_row(r) for r in rows]

    # ---- reconciliation ------------------------------------------------------------------

    def reconcile(
        self, now: float, *, lost_after_s: float, timeout_grace_s: float, up_since: float = 0.0
    ) -> Reconciled:
        """Declare silent runners lost and take their runs back; end runs past their timeout.

        A runner is silent past its own threshold (or ``lost_after_s``). ``up_since``: when
        this coordinator started; no runner could reach it before, so none is declared lost
        until a whole threshold has passed since then.
        Idempotent: running it twice, or from two coordinators, changes nothing more.
        """
        result = Reconciled()
        with self.db.transaction() as tx:
            silent = tx.execute(
                "SELECT id FROM runners WHERE state IN ('active', 'draining') "
                "AND last_heartbeat_at < ? - COALESCE(lost_after_s, ?) "
                "AND ? < ? - COALESCE(lost_after_s, ?) ORDER BY id " + self.db.lock_rows(),
                (now, lost_after_s, up_since, now, lost_after_s),
            )
            for runner in silent:
                rid = RunnerId(runner["id"])
                tx.execute("UPDATE runners SET state = 'lost' WHERE id = ?", (rid,))
                result.lost_runners.append(rid)
                released = _release_runner_runs(
                    tx, rid, now, f"runner {rid} was lost", self.db.lock_rows()
                )
                result.requeued.extend(released[0])
                result.failed.extend(released[1])
            overdue = tx.execute(
                "SELECT * FROM runs WHERE status IN ('claimed', 'running') "
                "AND timeout_s IS NOT NULL "
                "AND COALESCE(started_at, claimed_at) + timeout_s + ? < ? ORDER BY id "
                + self.db.lock_rows(),
                (timeout_grace_s, now),
            )
            for row in overdue:
                _transition(
                    tx,
                    row,
                    RunStatus.TIMED_OUT,
                    now,
                    finished_at=now,
                    error=f"run exceeded its timeout of {row['timeout_s']} s "
                    "and its runner did not stop it",
                )
                result.timed_out.append(RunId(row["id"]))
        return result

    # ---- sessions ------------------------------------------------------------------------

    def get_session(self, key: str) -> Session:
        """A session by id, or the most recent session with that name."""
        with self.db.transaction(write=False) as tx:
            row = tx.one("SELECT * FROM sessions WHERE id = ?", (key,)) or tx.one(
                "SELECT * FROM sessions WHERE name = ? ORDER BY updated_at DESC LIMIT 1", (key,)
            )
        if row is None:
            raise NotFound.of("session", key)
        return session_from_row(row)

    def list_sessions(self, limit: int = 50) -> list[Session]:
        """The most recently updated sessions first."""
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                "SELECT * FROM sessions ORDER BY updated_at DESC, id DESC LIMIT ?", (limit,)
            )
        return [session_from_row(r) for r in rows]


# ---- helpers (each runs inside the caller's transaction) -----------------------------------


def _check_owner(runner: Row, token_id: str) -> None:
    # A runner registered before tokens existed is adopted by the first token to name it.
    if runner["token_id"] is not None and runner["token_id"] != token_id:
        # Not the id in the message: it would confirm to a guesser whose it is.
        raise Forbidden(
            "that runner id was registered with another token; register without an id "
            "to get a new one",
            code="runner_not_yours",
        )


def _check_not_lost(runner: Row) -> None:
    """A runner declared lost (or stopped) holds nothing any more: it must register again."""
    if runner["state"] in (RunnerState.LOST, RunnerState.STOPPED):
        raise LeaseLost(
            f"runner {runner['id']} is {runner['state']}; register again", code="runner_lost"
        )


def _check_lease(row: Row, runner_id: str, attempt: int) -> None:
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


def _leased_row(tx: Tx, db: Database, run_id: str, runner_id: str, attempt: int) -> Row:
    row = row_by_id(tx, "runs", run_id, lock=db.lock_rows())
    _check_lease(row, runner_id, attempt)
    return row


def _transition(
    tx: Tx,
    row: Row,
    new: RunStatus,
    now: float,
    task_outcome: dict[str, Any] | None = None,
    reported: bool = False,
    **fields: Any,
) -> Run:
    """Move one run to ``new`` if the transition table allows it; guarded by its old status.

    A task's run that ends, however it ends (reported, lost for good, timed out,
    cancelled), moves its task on in the same transaction. ``reported``: the runner's final
    report ends it (its session is brought up to date by the caller); a run ended any other
    way still adds the cost it recorded before (a task's agent step) to its session."""
    old = RunStatus(row["status"])
    check_transition(row["id"], old, new)
    values = {**fields, "status": str(new), "updated_at": now}
    assignments = ", ".join(f"{name} = ?" for name in values)
    updated = tx.one(
        f"UPDATE runs SET {assignments} WHERE id = ? AND status = ? RETURNING *",
        (*values.values(), row["id"], str(old)),
    )
    if updated is None:  # cannot happen under the row lock; refuse rather than guess
        raise LeaseLost(f"run {row['id']} changed under us")
    run = run_from_row(updated)
    if new.is_terminal and not reported and run.session_id and run.cost_usd:
        tx.execute(
            "UPDATE sessions SET cost_usd = cost_usd + ?, updated_at = ? WHERE id = ?",
            (run.cost_usd, now, run.session_id),
        )
    if run.task_id and new.is_terminal:
        settle_task_run(tx, tx.lock, run, task_outcome, now)
    return run


def _requeue_after_rate_limit(
    tx: Tx, row: Row, report: RunReport, fields: dict[str, Any], now: float
) -> Run:
    if row["rate_limited"] >= MAX_RATE_LIMIT_REQUEUES:
        return _transition(
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
    return _transition(
        tx,
        row,
        RunStatus.PENDING,
        now,
        rate_limited=row["rate_limited"] + 1,
        available_at=now + (report.retry_after_s or 0.0),
        runner_id=None,
        error=report.error or report.result,
        session_id=fields.get("session_id", row["session_id"]),
    )


def _release_runner_runs(
    tx: Tx, runner_id: RunnerId, now: float, reason: str, lock: str
) -> tuple[list[RunId], list[RunId]]:
    """Runs held by a runner that is gone: back to pending while attempts remain.

    ``lock`` locks them first, so a report that is finishing one is waited for (and that
    run left alone) rather than found changed under us."""
    requeued: list[RunId] = []
    failed: list[RunId] = []
    held = tx.execute(
        "SELECT * FROM runs WHERE runner_id = ? AND status IN ('claimed', 'running') "
        f"ORDER BY id {lock}",
        (runner_id,),
    )
    for row in held:
        _release_run(tx, row, now, reason, requeued, failed)
    return requeued, failed


def _release_run(
    tx: Tx, row: Row, now: float, reason: str, requeued: list[RunId], failed: list[RunId]
) -> None:
    lost = _transition(tx, row, RunStatus.LOST, now, error=reason)
    lost_row = {**row, "status": str(RunStatus.LOST)}
    if lost.cancel_requested:
        _transition(
            tx, lost_row, RunStatus.CANCELLED, now, finished_at=now, error=f"cancelled ({reason})"
        )
        failed.append(lost.id)
    elif lost.attempts - lost.rate_limited < lost.max_attempts:
        _transition(tx, lost_row, RunStatus.PENDING, now, runner_id=None, available_at=now)
        requeued.append(lost.id)
    else:
        _transition(
            tx,
            lost_row,
            RunStatus.FAILED,
            now,
            finished_at=now,
            error=f"{reason}; no attempts left "
            f"({lost.attempts - lost.rate_limited}/{lost.max_attempts})",
        )
        failed.append(lost.id)


# A run the runner did not mention this long after it was claimed was lost on the way
# (the claim committed but its answer never reached the runner).
UNREPORTED_CLAIM_GRACE_S = 15.0


def _sync_held(
    tx: Tx, runner_id: RunnerId, held: Sequence[Held], now: float, lock: str
) -> RunnerSync:
    sync = RunnerSync()
    mine = {
        r["id"]: r
        for r in tx.execute(
            "SELECT * FROM runs WHERE runner_id = ? AND status IN ('claimed', 'running') "
            f"ORDER BY id {lock}",
            (runner_id,),
        )
    }
    reported = {h.run_id for h in held}
    for h in held:
        row = mine.get(h.run_id)
        if row is None or row["attempts"] != h.attempt:
            sync.abandon.append(h.run_id)
        elif row["cancel_requested"]:
            sync.cancel.append(h.run_id)
    requeued: list[RunId] = []
    for run_id, row in mine.items():
        if run_id not in reported and (row["claimed_at"] or 0) < now - UNREPORTED_CLAIM_GRACE_S:
            _release_run(tx, row, now, f"runner {runner_id} no longer reports it", requeued, [])
    return sync


def _upsert_session(tx: Tx, run: Row, now: float) -> None:
    agent_name = json.loads(run["agent"]).get("name") if run["agent"] else None
    tx.execute(
        "INSERT INTO sessions (id, name, agent_name, runner_id, project_dir, last_run_id, "
        "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET runner_id = excluded.runner_id, "
        "project_dir = excluded.project_dir, last_run_id = excluded.last_run_id, "
        "updated_at = excluded.updated_at",
        (
            run["session_id"],
            run["session_name"],
            agent_name,
            run["runner_id"],
            run["project_dir"],
            run["id"],
            now,
            now,
        ),
    )


def _finish_session(tx: Tx, run: Run, now: float) -> None:
    tx.execute(
        "INSERT INTO sessions (id, name, agent_name, runner_id, project_dir, last_run_id, "
        "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
        (
            run.session_id,
            run.session_name,
            run.agent_name,
            run.runner_id,
            run.project_dir,
            run.id,
            now,
            now,
        ),
    )
    tx.execute(
        "UPDATE sessions SET result = ?, is_error = ?, cost_usd = cost_usd + ?, "
        "runs = runs + 1, last_run_id = ?, runner_id = ?, updated_at = ? WHERE id = ?",
        (
            run.result,
            int(run.status is not RunStatus.COMPLETED),
            run.cost_usd or 0.0,
            run.id,
            run.runner_id,
            now,
            run.session_id,
        ),
    )
