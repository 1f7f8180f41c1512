"""Reconciliation: taking runs back from runners that are gone, or that no longer hold them.

``reconcile`` declares silent runners lost, ends runs past their timeout and fails lost
runs whose grace is over; ``sync_held`` compares what a runner says it holds with what the
store gave it; both release runs through ``release_runner_runs`` / ``release_run``. Each
runs inside the caller's transaction except ``reconcile``, which is one of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from corral.ids import RunId, RunnerId
from corral.runners import ALIVE, Held, RunnerState, RunnerSync, check_runner_transition
from corral.runs import RunStatus, after_lost, lost_for_good
from corral.store.db import Database, Row, Tx
from corral.store.rows import HELD, sql_in, sql_list
from corral.store.runs import GRACE_S, transition

# A run the runner did not mention this long after it was claimed was lost on the way
# (the claim committed but its answer never reached the runner).
UNREPORTED_CLAIM_GRACE_S = 15.0

# A run lost with no attempt left waits lost, for its runner's late final report, as long as
# that runner's lost threshold (its own, told at registration, else the coordinator's
# ``lost_after_s``): the lease the coordinator grants it, counted again from the loss.
# When the run was lost its runner had been silent that long, so its lease had run out and
# it had stopped the attempt (``corral.runner.lease``: a margin before the lease ends): how
# the attempt ended is settled, and its report waits in the runner's outbox for the link
# to come back. Its runner tries the link again meanwhile, from a short backoff that
# doubles (``backoff_delay``: 0.5 s on, at most 30 s and a quarter), so a cut that ends
# within the grace mostly gets the report in; and the grace bounds how long a run whose
# runner is really gone stays undecided, as long again as its runner was given before it
# was declared lost. After it the run fails as it always did, and a report coming later
# still is refused (ended runs never move).
_LOST = sql_in("status", {RunStatus.LOST})
# The runs waiting lost whose grace is over at ``?`` (now), the coordinator's threshold the
# second ``?``: read through runs_lost, a partial index of the (few) runs waiting lost.
LOST_PAST_GRACE = f"SELECT id FROM runs WHERE {_LOST} AND lost_at < ? - {GRACE_S}"


@dataclass(frozen=True)
class Reconciled:
    lost_runners: list[RunnerId] = field(default_factory=list)
    requeued: list[RunId] = field(default_factory=list)
    # Lost with no attempt left: waiting for a late report (the grace), then failed.
    waiting: list[RunId] = field(default_factory=list)
    failed: list[RunId] = field(default_factory=list)
    timed_out: list[RunId] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(
            self.lost_runners or self.requeued or self.waiting or self.failed or self.timed_out
        )

    def add(self, released: Released) -> None:
        self.requeued.extend(released.requeued)
        self.waiting.extend(released.waiting)
        self.failed.extend(released.ended)


@dataclass(frozen=True)
class Released:
    """Where ``release_run`` sent runs: back to pending, lost waiting for a late report
    (no attempt left), or ended (a cancel was asked; or no attempt left, its runner
    stopped)."""

    requeued: list[RunId] = field(default_factory=list)
    waiting: list[RunId] = field(default_factory=list)
    ended: list[RunId] = field(default_factory=list)


def reconcile(
    db: Database, now: float, *, lost_after_s: float, timeout_grace_s: float, up_since: float
) -> Reconciled:
    """Declare silent runners lost and take their runs back; end runs past their timeout.

    A runner is silent past its own threshold (or ``lost_after_s``), and it had a
    coordinator to talk to for that whole threshold of its silence: this one, up since
    ``up_since``, or another that said it was up (``store/coordinators.py``). A runner
    has no one to talk to while every coordinator is down: after a restart of them all, each
    runner gets its whole threshold to check in; after a restart of one while another was
    up, a runner silent all along is lost a threshold after it fell silent.
    Idempotent: running it twice, or from two coordinators, changes nothing more.
    """
    result = Reconciled()
    with db.transaction() as tx:
        silent = tx.execute(
            f"SELECT id, state FROM runners WHERE state IN ({sql_list(ALIVE)}) "
            "AND last_heartbeat_at < ? - COALESCE(lost_after_s, ?) "
            "AND (? < ? - COALESCE(lost_after_s, ?) OR EXISTS ("
            # a coordinator up for a threshold of its silence: from the later of its start
            # and the runner's last heartbeat to its last pass
            "SELECT 1 FROM coordinators c "
            "WHERE c.seen_at - COALESCE(runners.lost_after_s, ?) > c.up_since "
            "AND c.seen_at - COALESCE(runners.lost_after_s, ?) > runners.last_heartbeat_at)) "
            "ORDER BY id " + db.lock_rows(),
            (now, lost_after_s, up_since, now, lost_after_s, lost_after_s, lost_after_s),
        )
        for runner in silent:
            rid = RunnerId(runner["id"])
            check_runner_transition(rid, RunnerState(runner["state"]), RunnerState.LOST)
            tx.execute("UPDATE runners SET state = ? WHERE id = ?", (str(RunnerState.LOST), rid))
            result.lost_runners.append(rid)
            result.add(release_runner_runs(tx, rid, now, f"runner {rid} was lost"))
        fail_lost(tx, db, now, lost_after_s, result.failed)
        # The held runs are found through their index (runs_held), then locked in id order:
        # with the ORDER BY on the same select, SQLite read every run in id order instead,
        # each second (100,000 pending runs: 77 ms of the coordinator's CPU a second).
        overdue = tx.execute(
            "SELECT * FROM runs WHERE id IN ("
            f"SELECT id FROM runs WHERE status IN ({HELD}) AND timeout_s IS NOT NULL "
            "AND COALESCE(started_at, claimed_at) + timeout_s + ? < ?) ORDER BY id "
            + db.lock_rows(),
            (timeout_grace_s, now),
        )
        for row in overdue:
            transition(
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


def release_runner_runs(
    tx: Tx, runner_id: RunnerId, now: float, reason: str, *, report_may_come: bool = True
) -> Released:
    """Runs held by a runner that is gone: back to pending while attempts remain, else lost
    for a grace (``release_run``).

    They are locked first, so a report that is finishing one is waited for (and that run
    left alone) rather than found changed under us."""
    released = Released()
    held = tx.execute(
        f"SELECT * FROM runs WHERE runner_id = ? AND status IN ({HELD}) ORDER BY id {tx.lock}",
        (runner_id,),
    )
    for row in held:
        release_run(tx, row, now, reason, released, report_may_come=report_may_come)
    return released


def release_run(
    tx: Tx, row: Row, now: float, reason: str, released: Released, *, report_may_come: bool = True
) -> None:
    """A held run whose runner is gone: lost, then where ``after_lost`` sends it.

    The runner may have finished the attempt before it went: its late final report still
    ends the run while the run waits for it (``claims.reports_late``) — at pending while
    nobody has claimed it again, or, with no attempt left, lost until ``fail_lost`` ends
    the grace. The run stays on its runner (``runner_id``) while lost, as its end will be.
    ``report_may_come`` false: the runner was stopped (told to, or known dead), not lost
    or cut off; the last attempt fails at once."""
    lost = transition(
        tx, row, RunStatus.LOST, now, error=reason, lost_at=now, lost_runner_id=row["runner_id"]
    )
    lost_row = {**row, "status": str(RunStatus.LOST)}
    after = after_lost(
        cancel_requested=lost.cancel_requested,
        attempts=lost.attempts,
        rate_limited=lost.rate_limited,
        max_attempts=lost.max_attempts,
        report_may_come=report_may_come,
    )
    if after is RunStatus.LOST:
        released.waiting.append(lost.id)
    elif after is RunStatus.PENDING:
        transition(tx, lost_row, after, now, runner_id=None, available_at=now)
        released.requeued.append(lost.id)
    else:
        error = (
            f"cancelled ({reason})"
            if after is RunStatus.CANCELLED
            else lost_for_good(
                reason,
                attempts=lost.attempts,
                rate_limited=lost.rate_limited,
                max_attempts=lost.max_attempts,
            )
        )
        transition(tx, lost_row, after, now, finished_at=now, error=error)
        released.ended.append(lost.id)


def fail_lost(tx: Tx, db: Database, now: float, lost_after_s: float, failed: list[RunId]) -> None:
    """Fail the runs lost with no attempt left whose grace is over (``LOST_PAST_GRACE``), with
    the error they would have had at once before (``lost_for_good``).

    Once each, however many coordinators reconcile: each is locked and read again as lost
    (on PostgreSQL a lock waited for reads the row as the holder left it, and the
    ``status`` term drops one that moved on), and its update is guarded by that status
    (``transition``). A late report or a cancel that ended it first leaves it out."""
    expired = tx.execute(
        f"SELECT * FROM runs WHERE {_LOST} AND id IN ({LOST_PAST_GRACE}) ORDER BY id "
        + db.lock_rows(),
        (now, lost_after_s),
    )
    for row in expired:
        error = lost_for_good(
            row["error"],
            attempts=row["attempts"],
            rate_limited=row["rate_limited"],
            max_attempts=row["max_attempts"],
        )
        transition(tx, row, RunStatus.FAILED, now, finished_at=now, error=error)
        failed.append(RunId(row["id"]))


def sync_held(tx: Tx, runner_id: RunnerId, held: Sequence[Held], now: float) -> RunnerSync:
    """What the runner says it holds against what the store gave it: runs it holds that are
    no longer its own are abandoned, and ones it no longer mentions (past a grace) are
    taken back. (A cancel reaches it as a stored command: ``RunStore.request_cancel``.)"""
    sync = RunnerSync()
    mine = {
        r["id"]: r
        for r in tx.execute(
            f"SELECT * FROM runs WHERE runner_id = ? AND status IN ({HELD}) ORDER BY id {tx.lock}",
            (runner_id,),
        )
    }
    reported = {h.run_id for h in held}
    for h in held:
        row = mine.get(h.run_id)
        if row is None or row["attempts"] != h.attempt:
            sync.abandon.append(h.run_id)
    released = Released()
    for run_id, row in mine.items():
        if run_id not in reported and (row["claimed_at"] or 0) < now - UNREPORTED_CLAIM_GRACE_S:
            release_run(tx, row, now, f"runner {runner_id} no longer reports it", released)
    return sync
