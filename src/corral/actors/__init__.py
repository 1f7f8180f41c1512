"""Actors: long-lived processes on runners that sleep when idle and wake on demand."""
