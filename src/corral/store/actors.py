"""Actors in the store: their lifecycle rows, placements, each pool's queue and its hosts.

Every change runs ``actors.lifecycle`` on the row and carries out its effects in the same
transaction: a ``Place`` takes a free slot (below) or queues the actor, a ``SendStop``
stores a numbered stop_actor command for the runner, a ``DropKv`` empties its KV.

Placement (one transaction): a free actor slot on an active runner of the actor's pool
that hosts its name — the newest runner version first, then the most free slots. The
pool's hosts are locked first, so two placements never take the same last slot; every
operation locks the pool before the actor (one order: no deadlock). With no free slot the
actor waits in the pool's FIFO queue, served when a runner connects, when a slot is
released and when a runner becomes eligible again (``tick``).

``actor_placements`` (actor, runner, generation) is the single truth of where an actor
runs: runner events of another runner or generation are ignored, and KV requests are
accepted only from the runner the actor is placed on (``placed_on``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from corral.actors import lifecycle as lc
from corral.actors.lifecycle import ActorState, CrashPolicy, Life
from corral.actors.model import Actor, NewActor, Placement
from corral.actors.wire import start_command, stop_command
from corral.errors import NotFound
from corral.ids import ActorId, new_actor_id
from corral.store.commands import CommandStore
from corral.store.db import Database, Row, Tx

QUEUE_BATCH = 100  # queued actors looked at per pool in one serving
TICK_BATCH = 500  # actors whose timers are due, handled per tick

# Life's fields stored in columns of the same name (runner_id lives in actor_placements).
_LIFE_COLUMNS = tuple(f.name for f in fields(Life) if f.name != "runner_id")
_FLAGS = ("will_wake", "going_away", "destroying")


@dataclass
class Changes:
    """Who to wake: followers of these actors, push loops of these runners."""

    actors: set[str] = field(default_factory=set)
    runners: set[str] = field(default_factory=set)

    def update(self, other: Changes) -> None:
        self.actors |= other.actors
        self.runners |= other.runners


def _never_serverless(tx: Tx, pool: str) -> bool:
    return False


class ActorStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._commands = CommandStore(db)  # numbered commands for a runner (the link's queue)
        # Can a serverless endpoint grow ``pool``? (Set by the serverless pools' store.)
        self.is_serverless: Callable[[Tx, str], bool] = _never_serverless

    # ---- reads ---------------------------------------------------------------------------

    def get(self, actor_id: str) -> Actor:
        with self.db.transaction(write=False) as tx:
            return self._actor(tx, actor_id)

    def list(
        self,
        *,
        name: str | None = None,
        key: str | None = None,
        pool: str | None = None,
        states: Sequence[ActorState] = (),
        before: str | None = None,
        limit: int = 50,
    ) -> list[Actor]:
        """Newest first; ``before`` is the id of the last actor of the previous page."""
        where, params = [], []
        for column, value in (("a.name", name), ("a.key", key), ("a.pool", pool)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if states:
            where.append(f"a.state IN ({', '.join('?' for _ in states)})")
            params += [str(s) for s in states]
        with self.db.transaction(write=False) as tx:
            if before:
                anchor = self._row(tx, before)
                where.append("(a.created_at < ? OR (a.created_at = ? AND a.id < ?))")
                params += [anchor["created_at"], anchor["created_at"], anchor["id"]]
            clause = f"WHERE {' AND '.join(where)}" if where else ""
            rows = tx.execute(
                f"{_SELECT} {clause} ORDER BY a.created_at DESC, a.id DESC LIMIT ?",
                [*params, limit],
            )
        return [_actor_from_row(r) for r in rows]

    def placement(self, actor_id: str) -> Placement | None:
        """Where the actor is placed now (connectable or not); None if nowhere."""
        with self.db.transaction(write=False) as tx:
            row = tx.one(
                "SELECT runner_id, generation FROM actor_placements WHERE actor_id = ?",
                (actor_id,),
            )
        return None if row is None else Placement(ActorId(actor_id), *_placed(row))

    def placed_on(self, actor_id: str, runner_id: str, generation: int | None = None) -> bool:
        """Is the actor placed on ``runner_id`` (and as ``generation``, if given)? Only that
        runner, for that generation, may use its KV."""
        placement = self.placement(actor_id)
        return (
            placement is not None
            and placement.runner_id == runner_id
            and generation in (None, placement.generation)
        )

    def known(self, name: str, pool: str) -> bool:
        """Can an actor of ``name`` ever be placed in ``pool``? A runner of the pool has
        offered the name (connected now or not), or a serverless endpoint grows the pool."""
        with self.db.transaction(write=False) as tx:
            hosts = tx.execute("SELECT names FROM actor_hosts WHERE pool = ?", (pool,))
            if any(name in json.loads(h["names"]) for h in hosts):
                return True
            return self.is_serverless(tx, pool)

    def wanted_slots(self, pool: str) -> int:
        """Slots the pool's actors want: placed ones and queued ones (for autoscaling)."""
        with self.db.transaction(write=False) as tx:
            row = tx.one(WANTED_SLOTS, (pool, pool))
        return int(row["n"]) if row else 0

    # ---- changes -------------------------------------------------------------------------

    def create(self, spec: NewActor, now: float) -> tuple[Actor, bool, Changes]:
        """Get or create the actor ``spec.name``/``spec.key``: (actor, created, changes).
        A keyed create racing another one gets the other's actor."""
        changes = Changes()
        with self.db.transaction() as tx:
            if spec.key is not None and (found := self._by_key(tx, spec.name, spec.key)):
                return found, False, changes
            self._lock_pool(tx, spec.pool)
            actor_id = new_actor_id()
            life, effects = lc.new_life(spec.crash_policy, now)
            inserted = tx.one(
                "INSERT INTO actors (id, name, key, input, pool, crash_policy, state, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (name, key) DO NOTHING RETURNING id",
                (
                    *(actor_id, spec.name, spec.key, spec.input, spec.pool),
                    *(str(spec.crash_policy), str(life.state), now, now),
                ),
            )
            if inserted is None:  # a concurrent create of the same key won
                assert spec.key is not None
                found = self._by_key(tx, spec.name, spec.key)
                assert found is not None
                return found, False, changes
            actor = self._actor(tx, actor_id)
            self._carry_out(tx, actor, lc.Step(life, tuple(effects)), now, changes)
            return self._actor(tx, actor_id), True, changes

    def signal(self, actor_id: str, event: lc.Event, now: float) -> tuple[Actor, Changes]:
        """Apply a lifecycle event (wake, sleep, destroy from the API; runner events)."""
        changes = Changes()
        with self.db.transaction() as tx:
            actor = self._locked(tx, actor_id)
            self._carry_out(tx, actor, lc.step(actor.life, event, now), now, changes)
            return self._actor(tx, actor_id), changes

    def runner_event(self, runner_id: str, actor_id: str, event: lc.Event, now: float) -> Changes:
        """What a runner said about an actor; an actor unknown here is ignored (it may have
        been destroyed, its rows collected)."""
        changes = Changes()
        with self.db.transaction() as tx:
            try:
                actor = self._locked(tx, actor_id)
            except NotFound:
                return changes
            self._carry_out(tx, actor, lc.step(actor.life, event, now), now, changes)
        return changes

    def host(self, runner_id: str, pool: str, names: Sequence[str], slots: int) -> None:
        """A runner connected: the actor names it can host, in ``pool``, ``slots`` at a time.
        (Its queue is served by the next ``serve``.)"""
        with self.db.transaction() as tx:
            tx.execute(
                "INSERT INTO actor_hosts (runner_id, pool, names, slots) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (runner_id) DO UPDATE SET pool = excluded.pool, "
                "names = excluded.names, slots = excluded.slots",
                (runner_id, pool, json.dumps(sorted(set(names))), slots),
            )

    def serve(self, pool: str, now: float) -> Changes:
        """Place queued actors of ``pool`` into free slots, oldest first."""
        changes = Changes()
        with self.db.transaction() as tx:
            self._serve(tx, pool, now, changes)
        return changes

    def tick(self, now: float) -> Changes:
        """What time and runners' states do: due timers (thresholds, backoffs, alarms; a
        threshold makes an actor lost only once its runner is not alive), GoingAway for
        actors on draining runners, Lost for those on runners lost or stopped, and every
        pool's queue served."""
        changes = Changes()
        with self.db.transaction(write=False) as tx:
            due = tx.execute(
                "SELECT id FROM actors WHERE next_at <= ? ORDER BY next_at LIMIT ?",
                (now, TICK_BATCH),
            )
            stranded = tx.execute(
                "SELECT p.actor_id, p.runner_id, p.generation, r.state, a.going_away "
                "FROM actor_placements p JOIN actors a ON a.id = p.actor_id "
                "LEFT JOIN runners r ON r.id = p.runner_id "
                "WHERE r.state IS NULL OR r.state <> 'active'"
            )
            pools = [r["pool"] for r in tx.execute("SELECT DISTINCT pool FROM actor_queue")]
        for row in due:
            with self.db.transaction() as tx:
                actor = self._locked(tx, row["id"])
                alive = actor.life.runner_id is not None and tx.one(
                    "SELECT 1 AS x FROM runners WHERE id = ? AND state IN ('active', 'draining')",
                    (actor.life.runner_id,),
                )
                step = lc.due(actor.life, now, runner_alive=bool(alive))
                self._carry_out(tx, actor, step, now, changes)
        for row in stranded:
            runner_id, generation = row["runner_id"], row["generation"]
            if row["state"] == "draining":
                if not row["going_away"]:
                    event: lc.Event = lc.GoingAway(runner_id, generation)
                    changes.update(self.runner_event(runner_id, row["actor_id"], event, now))
            else:
                event = lc.Lost(runner_id, generation)
                changes.update(self.runner_event(runner_id, row["actor_id"], event, now))
        for pool in pools:
            changes.update(self.serve(pool, now))
        return changes

    # ---- the machinery -------------------------------------------------------------------

    def _carry_out(self, tx: Tx, actor: Actor, step: lc.Step, now: float, ch: Changes) -> None:
        old = actor.life
        life = step.life
        if life == old and not step.effects:
            return
        ch.actors.add(actor.id)
        self._save(tx, actor.id, life, now)
        if life.state is not ActorState.PENDING:
            tx.execute("DELETE FROM actor_queue WHERE actor_id = ?", (actor.id,))
        if old.runner_id is not None and life.runner_id is None:
            # A slot was released: the queue comes first (a restart waits its turn).
            tx.execute("DELETE FROM actor_placements WHERE actor_id = ?", (actor.id,))
            self._serve(tx, actor.pool, now, ch)
        for effect in step.effects:
            if isinstance(effect, lc.SendStop):
                if tx.one("SELECT 1 AS x FROM runners WHERE id = ?", (effect.runner_id,)):
                    self._commands.push(
                        effect.runner_id, [stop_command(actor.id, effect.generation)], now
                    )
                    ch.runners.add(effect.runner_id)
            elif isinstance(effect, lc.DropKv):
                tx.execute("DELETE FROM actor_kv WHERE actor_id = ?", (actor.id,))
            else:
                self._place(tx, replace(actor, life=life), now, ch)

    def _place(self, tx: Tx, actor: Actor, now: float, ch: Changes) -> bool:
        """Take a free slot for a pending actor, or queue it (or let it sleep)."""
        runner_id = self._free_slot(tx, actor.pool, actor.name)
        if runner_id is None:
            life = lc.no_capacity(actor.life, self.is_serverless(tx, actor.pool), now)
            self._save(tx, actor.id, life, now)
            if life.state is ActorState.PENDING:
                tx.execute(
                    "INSERT INTO actor_queue (pool, actor_id, queued_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (actor_id) DO NOTHING",
                    (actor.pool, actor.id, now),
                )
            return False
        life = lc.placed(actor.life, runner_id, now)
        self._save(tx, actor.id, life, now)
        tx.execute(
            "INSERT INTO actor_placements (actor_id, runner_id, generation, placed_at) "
            "VALUES (?, ?, ?, ?)",
            (actor.id, runner_id, life.generation, now),
        )
        tx.execute("DELETE FROM actor_queue WHERE actor_id = ?", (actor.id,))
        body = start_command(actor.id, life.generation, actor.name, actor.key, actor.input)
        self._commands.push(runner_id, [body], now)
        ch.runners.add(runner_id)
        return True

    def _free_slot(self, tx: Tx, pool: str, name: str) -> str | None:
        """The runner to place an actor of ``name`` on, or None (the pool is locked)."""
        rows = tx.execute(
            "SELECT h.runner_id, h.names, h.slots, r.version, "
            "(SELECT COUNT(*) FROM actor_placements p WHERE p.runner_id = h.runner_id) AS used "
            "FROM actor_hosts h JOIN runners r ON r.id = h.runner_id "
            "WHERE h.pool = ? AND r.state = 'active'",
            (pool,),
        )
        free = [r for r in rows if r["used"] < r["slots"] and name in json.loads(r["names"])]
        if not free:
            return None
        best = max(free, key=lambda r: (_version_key(r["version"]), r["slots"] - r["used"]))
        return str(best["runner_id"])

    def _serve(self, tx: Tx, pool: str, now: float, ch: Changes) -> None:
        self._lock_pool(tx, pool)
        queued = tx.execute(
            "SELECT actor_id FROM actor_queue WHERE pool = ? ORDER BY seq LIMIT ?",
            (pool, QUEUE_BATCH),
        )
        for row in queued:
            actor = self._locked(tx, row["actor_id"])
            if actor.state is not ActorState.PENDING or actor.life.placed:
                tx.execute("DELETE FROM actor_queue WHERE actor_id = ?", (actor.id,))
                continue
            if self._place(tx, actor, now, ch):
                ch.actors.add(actor.id)
            elif not self._free_slot_any(tx, pool):
                return  # the pool is full: the rest waits too

    def _free_slot_any(self, tx: Tx, pool: str) -> bool:
        row = tx.one(
            "SELECT COUNT(*) AS n FROM actor_hosts h JOIN runners r ON r.id = h.runner_id "
            "WHERE h.pool = ? AND r.state = 'active' AND h.slots > "
            "(SELECT COUNT(*) FROM actor_placements p WHERE p.runner_id = h.runner_id)",
            (pool,),
        )
        return bool(row and row["n"])

    def _lock_pool(self, tx: Tx, pool: str) -> None:
        if tx.lock:
            tx.execute(
                f"SELECT runner_id FROM actor_hosts WHERE pool = ? ORDER BY runner_id {tx.lock}",
                (pool,),
            )

    def _save(self, tx: Tx, actor_id: str, life: Life, now: float) -> None:
        values = {c: getattr(life, c) for c in _LIFE_COLUMNS}
        for flag in _FLAGS:
            values[flag] = int(values[flag])
        values["state"], values["crash_policy"] = str(life.state), str(life.crash_policy)
        values["next_at"] = lc.next_deadline(life)
        values["updated_at"] = now
        sets = ", ".join(f"{c} = ?" for c in values)
        tx.execute(f"UPDATE actors SET {sets} WHERE id = ?", [*values.values(), actor_id])

    def _row(self, tx: Tx, actor_id: str) -> Row:
        row = tx.one(f"{_SELECT} WHERE a.id = ?", (actor_id,))
        if row is None:
            raise NotFound(f"no actor {actor_id}", code="actor_not_found")
        return row

    def _actor(self, tx: Tx, actor_id: str) -> Actor:
        return _actor_from_row(self._row(tx, actor_id))

    def _locked(self, tx: Tx, actor_id: str) -> Actor:
        if tx.lock:
            pool = tx.one("SELECT pool FROM actors WHERE id = ?", (actor_id,))
            if pool is not None:
                self._lock_pool(tx, pool["pool"])
            tx.execute(f"SELECT id FROM actors WHERE id = ? {tx.lock}", (actor_id,))
        return self._actor(tx, actor_id)

    def _by_key(self, tx: Tx, name: str, key: str) -> Actor | None:
        row = tx.one(f"{_SELECT} WHERE a.name = ? AND a.key = ?", (name, key))
        return None if row is None else _actor_from_row(row)


# Placed actors are few, sleeping ones may be many: count from the placements, looking each
# actor up by its key. (SQLite, without statistics, chose to scan every actor of the pool;
# a CROSS JOIN keeps its tables in the order written there, and is an inner join elsewhere.)
WANTED_SLOTS = (
    "SELECT (SELECT COUNT(*) FROM actor_placements p CROSS JOIN actors a "
    "WHERE a.id = p.actor_id AND a.pool = ?) + "
    "(SELECT COUNT(*) FROM actor_queue WHERE pool = ?) AS n"
)
_SELECT = (
    "SELECT a.*, p.runner_id AS placed_runner_id FROM actors a "
    "LEFT JOIN actor_placements p ON p.actor_id = a.id"
)


def _placed(row: Row) -> tuple[str, int]:
    return str(row["runner_id"]), int(row["generation"])


def _actor_from_row(row: Row) -> Actor:
    values: dict[str, Any] = {c: row[c] for c in _LIFE_COLUMNS}
    for flag in _FLAGS:
        values[flag] = bool(values[flag])
    values["state"] = ActorState(row["state"])
    values["crash_policy"] = CrashPolicy(row["crash_policy"])
    life = Life(runner_id=row["placed_runner_id"], **values)
    return Actor(
        id=ActorId(row["id"]),
        name=row["name"],
        key=row["key"],
        input=row["input"],
        pool=row["pool"],
        created_at=row["created_at"],
        life=life,
    )


def _version_key(version: str) -> tuple[int, ...]:
    """``1.10.2`` after ``1.9``: the numbers in a version, compared as numbers."""
    return tuple(int(n) for n in re.findall(r"\d+", version)[:6])
