"""``corral doctor``: is everything in place to run work — the coordinator, its database,
live runners, and the agent CLI."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

import click

from corral import __version__
from corral.cli.options import connect, coordinator_url, option
from corral.cli.output import print_json
from corral.client.coordinators import split_urls
from corral.client.models import Runner, Stats
from corral.errors import CorralError, Forbidden, Unauthorized
from corral.store.schema import LATEST_VERSION

Check = Callable[[bool, str, str], None]
TOKEN_FIX = (
    "pass --token or CORRAL_TOKEN (a local coordinator's admin token is in .corral/credentials "
    "where it runs)"
)


@click.command()
@coordinator_url
@option(
    "--claude-bin",
    env="CLAUDE_BIN",
    default="claude",
    help="The Claude Code executable to look for here (runners use their own --claude-bin).",
)
@option("--json", "as_json", env="JSON", is_flag=True, help="Print the checks as JSON.")
def doctor(url: str, claude_bin: str, as_json: bool) -> None:
    """Check the coordinator, its database's migrations, live runners and `claude` here;
    one line each, exit 1 when something is wrong."""
    checks: list[dict[str, object]] = []

    def check(ok: bool, text: str, fix: str) -> None:
        checks.append({"ok": ok, "check": text, "fix": fix if not ok else ""})
        if not as_json:
            click.echo(
                f"{'ok  ' if ok else 'FAIL'}  {text}" + (f" — {fix}" if fix and not ok else "")
            )

    try:
        _run_checks(url, claude_bin, check)
    finally:
        if as_json:
            print_json(checks)
    if not all(c["ok"] for c in checks):
        raise SystemExit(1)


def _run_checks(url: str, claude_bin: str, check: Check) -> None:
    # Several coordinators (``--url A,B``): each is checked; the rest, through the first
    # that answers (they share one database).
    answers = [_answer(one, check) for one in split_urls(url)]
    answered = next((found for found in answers if found is not None), None)
    if answered is None:
        return
    stats, runners = answered
    schema = stats.schema_version or 0
    check(
        schema >= LATEST_VERSION,
        f"database schema version {schema} (this corral's newest: {LATEST_VERSION})",
        "restart the coordinator with this version: it migrates at start",
    )
    live = [r for r in runners if r.state == "active"]
    names = ", ".join(f"{r.name} ({r.slots_total} slots)" for r in live)
    check(
        bool(live),
        f"{len(live)} live runner(s){': ' + names if names else ''}",
        "start one: corral runner --url URL",
    )
    check_claude(claude_bin, check)


def _answer(url: str, check: Check) -> tuple[Stats, list[Runner]] | None:
    """The coordinator at ``url``'s figures and runners, checked; None if it does not answer."""
    with connect(url) as client:
        try:
            stats = client.stats()
            runners = client.list_runners()
        except (Unauthorized, Forbidden) as exc:
            check(False, f"coordinator at {url} refuses this token: {exc.message}", TOKEN_FIX)
            return None
        except CorralError as exc:
            check(False, f"coordinator at {url}: {exc.message}", "start it: corral up")
            return None
    check(True, f"coordinator at {url} answers (corral {stats.version}, here {__version__})", "")
    return stats, runners


def check_claude(claude_bin: str, check: Check) -> None:
    """The agent CLI here, and its version (runners on this host use the same one)."""
    found = shutil.which(claude_bin)
    if found is None:
        check(False, f"no {claude_bin!r} on PATH here", "install Claude Code, or name it")
        return
    try:
        done = subprocess.run(
            [found, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        check(False, f"{found} does not run", "reinstall Claude Code")
        return
    said = (done.stdout or done.stderr).strip().splitlines()
    version = said[0] if said and done.returncode == 0 else ""
    check(bool(version), f"{found}: {version or 'does not answer --version'}", "")
