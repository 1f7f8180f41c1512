"""The durable store: the only source of truth, on SQLite or PostgreSQL."""

from corral.store.logs import LogEntry, LogLine
from corral.store.reconcile import Reconciled
from corral.store.store import Store

__all__ = ["LogEntry", "LogLine", "Reconciled", "Store"]
