"""How the long-running commands (``serve``, ``up``, ``runner``) write their log: lines for
people, or one JSON object a line for a log pipeline (``--log-format json``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import click
from pythonjsonlogger.json import JsonFormatter

from corral.cli.options import option

TEXT, JSON = "text", "json"
# JSON records carry these names; fields given as ``extra=`` are added beside them.
JSON_FIELDS = {"levelname": "level", "name": "logger"}


def log_format_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return option(
        "--log-format",
        env="LOG_FORMAT",
        default=TEXT,
        type=click.Choice([TEXT, JSON]),
        help="Log lines for people, or one JSON object a line (timestamp, level, logger, "
        "message, exc_info).",
    )(fn)


def configure_logging(log_format: str) -> None:
    """The root logger writes to stderr in ``log_format``; uvicorn's loggers pass through it
    (``server_config``'s ``own_logging=False``)."""
    handler = logging.StreamHandler()
    if log_format == JSON:
        handler.setFormatter(
            JsonFormatter(
                "%(levelname)s %(name)s %(message)s", rename_fields=JSON_FIELDS, timestamp=True
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    logging.getLogger("uvicorn.error").addFilter(_not_cancelled_at_shutdown)


def _not_cancelled_at_shutdown(record: logging.LogRecord) -> bool:
    """A shutdown cancels the requests still open after its grace (runners' long-polls,
    followed logs): expected, not an error to print a traceback for."""
    exc = record.exc_info[1] if record.exc_info else None
    if isinstance(exc, asyncio.CancelledError):
        return False
    return "timeout graceful shutdown exceeded" not in record.getMessage()
