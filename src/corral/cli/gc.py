"""``corral gc`` and the retention flags it shares with ``corral serve`` and ``corral up``."""

from __future__ import annotations

import re
import time
from typing import Any

import click

from corral.cli.options import option
from corral.store import Store
from corral.store.retention import DAY, Retention

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY}
FOREVER = ("forever", "never", "off")


class Duration(click.ParamType[float | None, Any]):
    """``30d``, ``12h``, ``90m``, ``45s`` or plain seconds; ``forever`` (or ``off``): None."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, float):
            return value
        text = str(value).strip().lower()
        if text in FOREVER:
            return None
        found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", text)
        if not found or float(found[1]) <= 0:
            self.fail(f"{value!r} is not a duration like 30d, 12h, 90m, 45s or 'forever'")
        return float(found[1]) * _UNITS.get(found[2] or "s", 1.0)


DURATION = Duration()
_DEFAULT = Retention()


def retention_options(fn: click.decorators.FC) -> click.decorators.FC:
    for decorate in reversed(
        [
            option(
                "--retain-runs",
                env="RETAIN_RUNS",
                default="30d",
                type=DURATION,
                help="Finished runs (and their logs) are deleted this long after they ended; "
                "a session's last run and a task's current run are kept.",
            ),
            option(
                "--retain-runners",
                env="RETAIN_RUNNERS",
                default="7d",
                type=DURATION,
                help="Lost or stopped runners are deleted this long after their last "
                "heartbeat, once no kept run or session names them.",
            ),
            option(
                "--retain-events",
                env="RETAIN_EVENTS",
                default="7d",
                type=DURATION,
                help="Events (GET /events) are deleted this long after they happened; a "
                "client resuming from before them is told so.",
            ),
            option(
                "--max-log-chars",
                env="MAX_LOG_CHARS",
                default=_DEFAULT.log_chars,
                type=click.IntRange(min=0),
                help="A finished run's log over this many characters keeps its first and "
                "last halves and a marker line (0: no limit).",
            ),
        ]
    ):
        fn = decorate(fn)
    return fn


def retention_from(
    retain_runs: float | None,
    retain_runners: float | None,
    max_log_chars: int,
    retain_events: float | None = _DEFAULT.events_s,
) -> Retention:
    return Retention(
        runs_s=retain_runs,
        runners_s=retain_runners,
        log_chars=max_log_chars or None,
        events_s=retain_events,
    )


@click.command()
@option(
    "--db", env="DB", default=".corral/corral.db", help="SQLite file path, or a postgresql:// URL."
)
@retention_options
def gc(db: str, **kwargs: Any) -> None:
    """Delete old finished runs, their logs and silent runners, now (a coordinator also
    does it every --gc-interval). Safe while the coordinator runs."""
    store = Store.open(db)
    try:
        collected = store.collect_garbage(retention_from(**kwargs), time.time())
    finally:
        store.close()
    click.echo(
        f"deleted {collected.runs} runs, {collected.log_lines} log lines, "
        f"{collected.runners} runners, {collected.commands} runner commands, "
        f"{collected.events} events, {collected.run_requests} idempotency keys"
    )
