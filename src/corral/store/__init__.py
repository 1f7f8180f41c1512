"""The durable store: the only source of truth, on SQLite or PostgreSQL."""

from corral.store.store import Held, LogEntry, LogLine, Reconciled, RunnerSync, Store

__all__ = ["Held", "LogEntry", "LogLine", "Reconciled", "RunnerSync", "Store"]
