"""The claim reads its partial index on SQLite: a guard spelled ``status IN ('pending')``
instead of the index's own ``status = 'pending'`` made SQLite scan every run on every claim
(control-plane CPU per run 0.8 → 1.4 ms with 10,000 runs stored). A pool's wanted slots are
counted from the placements, not by scanning its actors (10,000 may sleep). A claim reads
no pending run its runner cannot take (issue 16 §3: with 100,000 of them waiting for a label
no runner had, each claim read them all and a dispatch took 326 ms)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from corral.runs import NewRun, RunType
from corral.store import Store
from corral.store.actors import WANTED_SLOTS
from corral.store.claims import CLAIMABLE
from corral.store.db import SqliteDatabase, open_database
from corral.store.reconcile import LOST_PAST_GRACE
from corral.store.rows import HELD

NOW = 1_700_000_000.0


def command(**kw: object) -> NewRun:
    return NewRun(type=RunType.COMMAND, command=("true",), **kw)  # type: ignore[arg-type]


def plan(db_path: Path, sql: str) -> str:
    db = open_database(str(db_path))
    try:
        with db.transaction(write=False) as tx:
            rows = tx.execute(f"EXPLAIN QUERY PLAN {sql}", (0.0, 1))
        return " | ".join(str(r["detail"]) for r in rows)
    finally:
        db.close()


def test_the_claim_reads_the_claimable_index(tmp_path: Path) -> None:
    found = plan(
        tmp_path / "plans.db",
        f"SELECT id FROM runs WHERE {CLAIMABLE} AND available_at <= ? "
        "ORDER BY priority DESC, created_at, id LIMIT ?",
    )
    assert "USING INDEX runs_claimable" in found, found


def test_a_runners_held_runs_are_read_through_their_index(tmp_path: Path) -> None:
    found = plan(
        tmp_path / "plans.db",
        f"SELECT id FROM runs WHERE runner_id = ? AND status IN ({HELD}) LIMIT ?",
    )
    assert "runs_held" in found, found


def test_the_look_for_lost_runs_past_their_grace_reads_their_index(tmp_path: Path) -> None:
    """The reconciler looks each second for runs lost with no attempt left whose grace is
    over: only the runs waiting lost are read, not every run."""
    found = plan(tmp_path / "plans.db", LOST_PAST_GRACE)
    # (A scan of that partial index, not of the table: "SCAN runs USING INDEX runs_lost".)
    assert found.startswith("SCAN runs USING INDEX runs_lost |"), found


def test_wanted_slots_count_placements_not_every_sleeping_actor(tmp_path: Path) -> None:
    db = open_database(str(tmp_path / "plans.db"))
    try:
        with db.transaction(write=False) as tx:
            rows = tx.execute(f"EXPLAIN QUERY PLAN {WANTED_SLOTS}", ("default", "default"))
        found = " | ".join(str(r["detail"]) for r in rows)
    finally:
        db.close()
    assert "SCAN a" not in found and "SEARCH a USING INDEX" in found, found


def rows_read(store: Store, claim: Callable[[], object]) -> int:
    """What ``claim`` reads of the runs table: SQLite virtual machine steps (in hundreds),
    or on PostgreSQL the rows its scans of runs fetched (this transaction's statistics)."""
    db = store.db
    with db.transaction() as tx:
        if isinstance(db, SqliteDatabase):
            steps = [0]

            def step() -> int:
                steps[0] += 1
                return 0

            conn = db._conn()
            conn.set_progress_handler(step, 100)
            try:
                claim()
            finally:
                conn.set_progress_handler(None, 100)
            return steps[0]
        read = (
            "SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) AS n FROM pg_stat_xact_user_tables "
            "WHERE relid = 'runs'::regclass"
        )
        before = tx.one(read)
        claim()
        after = tx.one(read)
    assert before is not None and after is not None
    return int(after["n"]) - int(before["n"])


def test_a_claim_does_not_read_the_runs_its_runner_cannot_take(store: Store) -> None:
    """Issue 16 §3: with thousands of older pending runs that need a label the runner lacks
    or another runner, a claim reads about what it reads without them (it read them all,
    row by row, when the labels were matched along the claim order)."""
    runner, _ = store.runners.register(
        name="me", hostname="h", labels=["linux"], slots=4, version="0", transport="http", now=NOW
    )

    def claim_one() -> None:
        assert len(store.runs.claim(runner.id, 1, NOW + 10)) == 1

    mine = [command(), command(labels=("linux",)), command(required_runner="me")]
    store.runs.create_many(mine, NOW)
    alone = rows_read(store, claim_one)
    store.runs.create_many([command(labels=("gpu",)) for _ in range(2000)], NOW - 100)
    store.runs.create_many([command(required_runner="other") for _ in range(1000)], NOW - 100)
    with_backlog = rows_read(store, claim_one)
    assert with_backlog <= 2 * alone + 10, (alone, with_backlog)


def test_the_look_for_runs_claimable_since_does_not_read_the_backlog(store: Store) -> None:
    """The reconciler looks each second for runs claimable since its last look: runs that
    wait unchanged before it are not read (it read every pending run: 2.5 s a look with
    100,000 waiting, on this machine under load)."""

    def look() -> None:
        assert store.runs.has_claimable(NOW + 10, since=NOW - 1)
        assert not store.runs.has_claimable(NOW + 10, since=NOW)

    store.runs.create_many([command()], NOW)
    alone = rows_read(store, look)
    store.runs.create_many([command(labels=("gpu",)) for _ in range(3000)], NOW - 100)
    with_backlog = rows_read(store, look)
    assert with_backlog <= 2 * alone + 10, (alone, with_backlog)


def test_the_reconciler_does_not_read_pending_runs(store: Store) -> None:
    """The reconciler's pass each second looks for overdue runs among the held ones only (it
    read every run, in id order, on SQLite: 100,000 pending runs cost the coordinator 77 ms
    of CPU a second)."""

    def reconcile() -> None:
        store.reconcile(NOW + 10, lost_after_s=30.0, timeout_grace_s=5.0, up_since=NOW)

    store.runs.create_many([command(timeout_s=60.0)], NOW)
    alone = rows_read(store, reconcile)
    store.runs.create_many([command(labels=("gpu",)) for _ in range(3000)], NOW - 100)
    with_backlog = rows_read(store, reconcile)
    assert with_backlog <= 2 * alone + 10, (alone, with_backlog)


def test_a_batchs_runs_are_stored_in_the_order_claims_take_them(tmp_path: Path) -> None:
    """A batch's runs share their creation time, so claims take them by id: stored in that
    order, the runs of one claim share a page of the table (inserted as they came, each lay
    on a page of its own, written again at each commit of its claim, start and end)."""
    store = Store(open_database(str(tmp_path / "order.db")))
    try:
        created = store.runs.create_many([command() for _ in range(50)], NOW)
        runner, _ = store.runners.register(
            name="me", hostname="h", labels=[], slots=50, version="0", transport="http", now=NOW
        )
        claimed = store.runs.claim(runner.id, 50, NOW + 1)
        with store.db.transaction(write=False) as tx:
            stored = [r["id"] for r in tx.execute("SELECT id FROM runs ORDER BY rowid")]
    finally:
        store.close()
    assert [r.id for r in claimed] == stored
    assert stored != [r.id for r in created]  # the batch's own order is not the claims'


def test_runs_are_indexed_by_session_and_by_task_only_when_they_have_one(tmp_path: Path) -> None:
    """A command's run has neither: no entry of those indexes to write as it is created.
    Runs are still found by either through its index."""
    db = open_database(str(tmp_path / "plans.db"))
    try:
        with db.transaction(write=False) as tx:
            partial = {r["name"]: r["partial"] for r in tx.execute("PRAGMA index_list(runs)")}
    finally:
        db.close()
    assert partial["runs_by_session"] == partial["runs_by_task"] == 1, partial
    by_session = plan(tmp_path / "plans.db", "SELECT id FROM runs WHERE session_id = ? LIMIT ?")
    assert "USING INDEX runs_by_session" in by_session, by_session
    by_task = plan(tmp_path / "plans.db", "SELECT id FROM runs WHERE task_id = ? LIMIT ?")
    assert "USING INDEX runs_by_task" in by_task, by_task
