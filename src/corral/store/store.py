"""The store: one database, and a sub-store for each thing it keeps.

Every sub-store is built the same way, from the database, and names each of its queries
once: ``store.runs`` (created, claimed, reported), ``store.runners``, ``store.sessions``,
``store.callbacks`` (sub-agents' results owed to their parents), ``store.logs``,
``store.projects``, ``store.tasks``, ``store.commands`` (the WebSocket
link's numbered commands), ``store.actors``, ``store.kv`` (actors' state), ``store.pools``
(serverless pools) and ``store.tokens``. What spans them all (reconciliation, garbage
collection, the plans PostgreSQL keeps) is here.
"""

from __future__ import annotations

from corral.store.actors import ActorStore
from corral.store.callbacks import CallbackStore
from corral.store.commands import CommandStore
from corral.store.db import Database, open_database
from corral.store.kv import KvStore
from corral.store.logs import LogStore
from corral.store.plans import analyze_grown
from corral.store.pools import PoolStore
from corral.store.projects import ProjectStore
from corral.store.reconcile import Reconciled, reconcile
from corral.store.retention import Collected, Retention, collect
from corral.store.runners import RunnerStore
from corral.store.runs import RunStore
from corral.store.sessions import SessionStore
from corral.store.tasks import TaskStore
from corral.store.tokens import TokenStore


class Store:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.runs = RunStore(db)
        self.runners = RunnerStore(db)
        self.sessions = SessionStore(db)
        self.callbacks = CallbackStore(db)
        self.logs = LogStore(db)
        self.projects = ProjectStore(db)
        self.tasks = TaskStore(db)
        self.commands = CommandStore(db)
        self.kv = KvStore(db)
        self.tokens = TokenStore(db)
        self.actors = ActorStore(db)
        self.pools = PoolStore(db)
        self.actors.is_serverless = self.pools.is_serverless

    @classmethod
    def open(cls, url: str) -> Store:
        return cls(open_database(url))

    def close(self) -> None:
        self.db.close()

    def reconcile(
        self, now: float, *, lost_after_s: float, timeout_grace_s: float, up_since: float = 0.0
    ) -> Reconciled:
        """Declare silent runners lost and take their runs back; end runs past their
        timeout (``reconcile.py``)."""
        return reconcile(
            self.db,
            now,
            lost_after_s=lost_after_s,
            timeout_grace_s=timeout_grace_s,
            up_since=up_since,
        )

    def collect_garbage(self, retention: Retention, now: float) -> Collected:
        """Delete finished work older or larger than ``retention`` allows (``retention.py``)."""
        return collect(self.db, retention, now)

    def analyze_grown(self) -> list[str]:
        """PostgreSQL: analyze the tables grown past what their plans were made for
        (``plans.py``)."""
        return analyze_grown(self.db)

    def schema_version(self) -> int:
        """The newest migration applied to this database."""
        with self.db.transaction(write=False) as tx:
            row = tx.one("SELECT MAX(version) AS v FROM schema_migrations")
        return int(row["v"]) if row and row["v"] is not None else 0
