"""Runners in the store: registered, kept alive by heartbeats, drained and stopped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from corral.errors import Forbidden, InvalidRequest, NotFound
from corral.ids import RunnerId, new_runner_id
from corral.runners import (
    ALIVE,
    Held,
    Runner,
    RunnerState,
    RunnerSync,
    check_runner_transition,
    state_after,
)
from corral.store.claims import check_not_lost
from corral.store.db import Database, Row
from corral.store.reconcile import release_runner_runs, sync_held
from corral.store.rows import HELD, dumps, row_by_id, runner_from_row, sql_list


class Order(NamedTuple):
    """What was asked of a runner, through whichever coordinator: its state, and for a
    drain asked of it, the seconds of its grace that are left (None: none asked)."""

    state: RunnerState
    drain_grace_left_s: float | None


class Head(NamedTuple):
    """A runner's row as the coordinator holding its socket compares it with what it sent:
    its state and the index of the last command stored for it (0: none)."""

    state: RunnerState
    last_command_idx: int


# Runner ids named in one statement of ``heads`` (SQLite allows 32,766 variables).
_HEADS_CHUNK = 1000


class RunnerStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def register(
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
        keep_drain: bool = False,
        coordinator_url: str | None = None,
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
        ``keep_drain``: a drain asked of it while it was away stays asked (the WebSocket
        link: the same process reconnects, and is told to drain once connected).
        ``coordinator_url``: the coordinator whose socket it registered on (the WebSocket
        link; a peer's gateway forwards its actors' requests there), replacing the last.
        Checked in this transaction: a reconciler cannot declare it lost in between."""
        if slots < 1:
            raise InvalidRequest("a runner needs at least one slot")
        with self.db.transaction() as tx:
            known = runner_id and tx.one(
                "SELECT id, state, token_id, drain_grace_s FROM runners WHERE id = ? "
                f"{self.db.lock_rows()}",
                (runner_id,),
            )
            if known and token_id is not None:
                _check_owner(known, token_id)
            if known and not revive and known["state"] not in ALIVE:
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
                drained = (
                    keep_drain
                    and known["state"] == RunnerState.DRAINING
                    and known["drain_grace_s"] is not None
                )
                state = RunnerState.DRAINING if drained else RunnerState.ACTIVE
                check_runner_transition(known["id"], RunnerState(known["state"]), state)
                tx.execute(
                    "UPDATE runners SET name = ?, hostname = ?, labels = ?, slots = ?, "
                    "version = ?, transport = ?, last_heartbeat_at = ?, lost_after_s = ?, "
                    "token_id = COALESCE(token_id, ?), state = ?, stopped_at = NULL, "
                    "drain_at = CASE WHEN ? THEN drain_at END, "
                    "drain_grace_s = CASE WHEN ? THEN drain_grace_s END, coordinator_url = ? "
                    "WHERE id = ?",
                    (*values, token_id, str(state), drained, drained, coordinator_url, runner_id),
                )
                rid = RunnerId(str(runner_id))
            else:
                rid = new_runner_id()
                tx.execute(
                    "INSERT INTO runners (id, name, hostname, labels, slots, version, transport, "
                    "last_heartbeat_at, lost_after_s, registered_at, token_id, state, "
                    "coordinator_url) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (rid, *values, now, token_id, str(RunnerState.ACTIVE), coordinator_url),
                )
            sync = RunnerSync() if held is None else sync_held(tx, rid, held, now)
            return runner_from_row(row_by_id(tx, "runners", rid)), sync

    def heartbeat(self, runner_id: str, held: Sequence[Held] | None, now: float) -> RunnerSync:
        """A runner is alive and holds ``held``; raises NotFound for an unknown runner and
        ``runner_lost`` if it was declared lost (it must register again).

        ``held=None``: the runner did not say what it holds (the seed's heartbeat is only
        ``{runner_id}``). Not saying is not "nothing": its leases are kept alive and none of
        its runs is touched; only an explicit list is reconciled."""
        with self.db.transaction() as tx:
            row = row_by_id(tx, "runners", runner_id, lock=self.db.lock_rows())
            check_not_lost(row)
            tx.execute("UPDATE runners SET last_heartbeat_at = ? WHERE id = ?", (now, runner_id))
            if held is None:
                return RunnerSync()
            return sync_held(tx, RunnerId(runner_id), held, now)

    def token_id(self, runner_id: str) -> str | None:
        """The id of the token the runner registered with (None: registered before tokens,
        or by an internal caller); ``runner_not_found`` if there is no such runner."""
        with self.db.transaction(write=False) as tx:
            row = tx.one("SELECT token_id FROM runners WHERE id = ?", (runner_id,))
        if row is None:
            raise NotFound.of("runner", runner_id)
        token_id: str | None = row["token_id"]
        return token_id

    def former_identity(self, runner_id: str, former_id: str) -> bool:
        """Was ``former_id`` an earlier identity of the runner registered as ``runner_id``?
        A runner whose lease ran out registers again under a new id, and reports what it
        finished under the old one: the same name, registered with the same token."""
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                "SELECT id, name, token_id FROM runners WHERE id IN (?, ?)", (runner_id, former_id)
            )
        found = {r["id"]: (r["name"], r["token_id"]) for r in rows}
        return runner_id != former_id and len(found) == 2 and found[runner_id] == found[former_id]

    def touch(self, runner_ids: Sequence[str], now: float) -> None:
        """Heartbeats of connected runners (their pings), written in one statement.

        On PostgreSQL their rows are locked in the order of their ids, byte by byte: the
        order a store writer's group locks the runners it acts for (``coordinator.writer``,
        Python's order of the ids). Locked as the table was read, one runner before another
        that a group held while it waited for the first, they deadlocked: PostgreSQL found
        it after a second (deadlock_timeout), and meanwhile those runners' work stood still
        (a run_cost.py round in three lost a second so)."""
        if not runner_ids:
            return
        alive = (
            f"WHERE id IN ({', '.join('?' for _ in runner_ids)}) AND state IN ({sql_list(ALIVE)})"
        )
        with self.db.transaction() as tx:
            if self.db.dialect == "postgres":
                tx.execute(
                    "WITH locked AS (SELECT id FROM runners "
                    f'{alive} ORDER BY id COLLATE "C" {self.db.lock_rows()}) '
                    "UPDATE runners SET last_heartbeat_at = ? FROM locked "
                    "WHERE runners.id = locked.id",
                    (*runner_ids, now),
                )
            else:
                tx.execute(f"UPDATE runners SET last_heartbeat_at = ? {alive}", (now, *runner_ids))

    def set_state(
        self, runner_id: str, state: RunnerState, now: float, grace_s: float | None = None
    ) -> Runner:
        """Drain or stop a runner (``runners.state_after``: draining one that is gone
        leaves it as it is); stopping it takes back the runs it holds. ``grace_s``: a
        drain asked of the runner, the time it has to finish (kept for the coordinator
        holding its socket: ``order``); None for a runner draining of itself."""
        with self.db.transaction() as tx:
            row = row_by_id(tx, "runners", runner_id, lock=self.db.lock_rows())
            if state_after(runner_id, RunnerState(row["state"]), state) is not state:
                return runner_from_row(row)
            asked = state is RunnerState.DRAINING and grace_s is not None
            if state is RunnerState.DRAINING and row["state"] == state and not asked:
                return runner_from_row(row)  # it says it stops: a drain asked stays asked
            if grace_s is not None and row["state"] == state and _drain_ends_by(row, now + grace_s):
                # Asked before with a deadline no later (a drain sent again): the runner
                # keeps the earliest deadline it was given, and so does the store.
                return runner_from_row(row)
            if state is RunnerState.STOPPED and row["state"] == state:
                return runner_from_row(row)  # stopped before: a stop sent again changes nothing
            tx.execute(
                "UPDATE runners SET state = ?, "
                "drain_at = CASE WHEN ? = 'draining' THEN ? ELSE drain_at END, "
                "drain_grace_s = CASE WHEN ? THEN ? ELSE drain_grace_s END, "
                "stopped_at = CASE WHEN ? = 'stopped' THEN ? ELSE stopped_at END WHERE id = ?",
                (state, state, now, asked, grace_s, state, now, runner_id),
            )
            if state is RunnerState.STOPPED:
                # Stopped (told to, or known dead: ``cli.embedded``), not lost: no late
                # report of a last attempt is waited for.
                release_runner_runs(
                    tx, RunnerId(runner_id), now, "runner stopped", report_may_come=False
                )
            return runner_from_row(row_by_id(tx, "runners", runner_id))

    def order(self, runner_id: str, now: float) -> Order:
        """What was asked of the runner through any coordinator (drained, stopped): the
        coordinator holding its socket passes it on (``corral.coordinator.socket``)."""
        with self.db.transaction(write=False) as tx:
            row = tx.one(
                "SELECT state, drain_at, drain_grace_s FROM runners WHERE id = ?", (runner_id,)
            )
        if row is None:
            raise NotFound.of("runner", runner_id)
        state = RunnerState(row["state"])
        if state is not RunnerState.DRAINING or row["drain_grace_s"] is None:
            return Order(state, None)
        return Order(state, max(0.0, row["drain_at"] + row["drain_grace_s"] - now))

    def heads(self, runner_ids: Sequence[str]) -> dict[str, Head]:
        """The state and last command of each of ``runner_ids`` (unknown ones are left out),
        in one read: what a coordinator whose listener reconnected compares with its
        sockets, instead of each socket looking at its own row (``Coordinator.rescan``)."""
        heads: dict[str, Head] = {}
        with self.db.transaction(write=False) as tx:
            for start in range(0, len(runner_ids), _HEADS_CHUNK):
                chunk = runner_ids[start : start + _HEADS_CHUNK]
                rows = tx.execute(
                    "SELECT id, state, next_command_idx FROM runners "
                    f"WHERE id IN ({', '.join('?' for _ in chunk)})",
                    tuple(chunk),
                )
                for row in rows:
                    heads[row["id"]] = Head(RunnerState(row["state"]), row["next_command_idx"] - 1)
        return heads

    def coordinator_url(self, runner_id: str) -> str | None:
        """The coordinator holding the runner's socket, as far as the store knows (the
        last to register it); None for a runner on HTTP or unknown."""
        with self.db.transaction(write=False) as tx:
            row = tx.one("SELECT coordinator_url FROM runners WHERE id = ?", (runner_id,))
        return None if row is None else row["coordinator_url"]

    def get(self, runner_id: str) -> Runner:
        with self.db.transaction(write=False) as tx:
            return runner_from_row(row_by_id(tx, "runners", runner_id))

    def list(self) -> list[Runner]:
        with self.db.transaction(write=False) as tx:
            rows = tx.execute(
                "SELECT r.*, (SELECT COUNT(*) FROM runs WHERE runs.runner_id = r.id "
                f"AND runs.status IN ({HELD})) AS slots_used "
                "FROM runners r ORDER BY r.registered_at DESC"
            )
        return [runner_from_row(r) for r in rows]


def _check_owner(runner: Row, token_id: str) -> None:
    # A runner registered before tokens existed is adopted by the first token to name it.
    if runner["token_id"] is not None and runner["token_id"] != token_id:
        # Not the id in the message: it would confirm to a guesser whose it is.
        raise Forbidden(
            "that runner id was registered with another token; register without an id "
            "to get a new one",
            code="runner_not_yours",
        )


def _drain_ends_by(row: Row, deadline: float) -> bool:
    """Was a drain asked of the runner (``row``) that ends no later than ``deadline``?"""
    asked_at, grace_s = row["drain_at"], row["drain_grace_s"]
    return asked_at is not None and grace_s is not None and asked_at + grace_s <= deadline
