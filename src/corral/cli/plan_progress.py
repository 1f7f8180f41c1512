"""What ``corral tasks run`` shows while it works and when it ends, and its exit status.

On a terminal, a live table of the tasks under way; otherwise (CI, ``| tee``) one plain
line per change as it happens, so a log shows progress and never a redrawn table. The
summary always starts on a line of its own.

The watch ends when nothing is left to do, or when the plan is held (paused, or at its
budget) or its plan run was stopped (the runner lacks the agent's program) and the tasks
that were under way have finished: neither stops a task under way.

The plan's state is read again when the coordinator's event stream says one of its runs,
tasks (a step done included) or the plan itself changed (``PlanChanges``), not on a timer;
a live table is redrawn every second in between, from what was read, for its clocks.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import click
import httpx
from httpx_sse import connect_sse
from rich.console import Console
from rich.live import Live
from rich.table import Table

from corral.client.coordinators import Coordinators
from corral.credentials import auth_headers, read_token

ACTIVE = ("claimed", "in_progress", "merging")
WAITING = ("ready", "blocked", *ACTIVE)
FAILURES = ("failed", "merge_conflict", "blocked_by_failure", "cancelled")
COLORS = {
    "completed": "green",
    "failed": "red",
    "merge_conflict": "red",
    "blocked_by_failure": "yellow",
    "cancelled": "yellow",
    "interrupted": "yellow",
    "in_progress": "cyan",
    "merging": "magenta",
    "claimed": "cyan",
    "ready": "blue",
}
# sysexits' EX_TEMPFAIL: nothing failed, the plan is held; resume it and run again.
EXIT_PAUSED = 75
POLL_INTERVAL_S = 0.2  # a coordinator without the event stream is asked this often
REDRAW_S = 1.0  # the live table's clocks move this often, without asking the coordinator
RECONNECT_MAX_S = 5.0

State = dict[str, Any]
log = logging.getLogger("corral.cli")


def colored(status: str) -> str:
    color = COLORS.get(status)
    return f"[{color}]{status}[/]" if color else status


def state_label(task: dict[str, Any]) -> str:
    """A task's state for people: an interrupted one says so (its runner is gone)."""
    if task.get("interrupted"):
        return f"{colored('interrupted')} ({task['status']})"
    return colored(task["status"])


def first_line(text: str | None) -> str:
    return (text or "").strip().split("\n", 1)[0]


def held(project: dict[str, Any]) -> bool:
    return bool(project["paused"] or project.get("budget_reached"))


class PlanChanges:
    """Says when a plan may have changed: follows ``GET /events`` for the plan's runs, tasks
    and the plan itself in a thread of its own, and sets ``changed`` at each event. Each
    time the stream opens (the first time, after a reconnect or a ``dropped``) it sets it
    too: what happened while it was not open is in the next read. A coordinator without
    the stream (older): set every POLL_INTERVAL_S. Leaving it shuts its socket, so the
    stream ends at once (a read blocked in another thread ends only so). Of several
    coordinators (``url``: a list, commas, or the command's client's ``Coordinators``, so
    that both follow the one answering), a failed stream opens again at the next one."""

    def __init__(
        self, url: str | Sequence[str] | Coordinators, token: str | None, plan_id: str
    ) -> None:
        self.changed = threading.Event()
        self.caught_up = threading.Event()  # the stream has been open and read up to date
        self.recent: deque[dict[str, Any]] = deque(maxlen=50)  # the last events (to debug)
        self._coordinators = url if isinstance(url, Coordinators) else Coordinators(url)
        self._headers = auth_headers(read_token() if token is None else token)
        self._params = {"plan": plan_id, "kind": "run,task,plan"}
        self._stopping = threading.Event()
        self._socket: socket.socket | None = None
        self._thread = threading.Thread(target=self._follow, name="plan-changes", daemon=True)

    def __enter__(self) -> PlanChanges:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)

    def wait(self, timeout: float) -> bool:
        """Whether something changed within ``timeout`` (the flag is cleared: changes after
        this call set it again)."""
        found = self.changed.wait(timeout)
        self.changed.clear()
        return found

    def _follow(self) -> None:
        delay = 0.2
        while not self._stopping.is_set():
            try:
                if not self._stream():
                    while not self._stopping.wait(POLL_INTERVAL_S):  # no stream: ask often
                        self.changed.set()
                    return
                delay = 0.2
            except (httpx.HTTPError, OSError):  # the coordinator went away, or we shut it
                pass
            except Exception:  # anything else: never leave the watch without news
                log.exception("following the plan's events failed; trying again")
            self._socket = None
            # While there is no stream, the state is read at each attempt: a stream refused
            # for good (say, a proxy that cuts it) slows the progress shown, never stops it.
            self.changed.set()
            self._stopping.wait(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)

    def _stream(self) -> bool:
        """Follow the stream until it ends; False if the coordinator has none."""
        url = self._coordinators.current
        try:
            return self._stream_from(url)
        except (httpx.HTTPError, OSError):
            self._coordinators.move_on(url)
            raise

    def _stream_from(self, url: str) -> bool:
        timeout = httpx.Timeout(10.0, read=None)  # quiet streams send a keepalive every 15 s
        with (
            httpx.Client(base_url=url, headers=self._headers, timeout=timeout) as http,
            connect_sse(http, "GET", "/events", params=self._params) as source,
        ):
            if source.response.status_code == 404:
                return False
            source.response.raise_for_status()
            self._socket = source.response.extensions["network_stream"].get_extra_info("socket")
            if self._stopping.is_set():
                return True
            for message in source.iter_sse():
                if not message.data:
                    continue  # a keepalive
                self.changed.set()  # ready, caught_up, an event, or dropped
                if message.event == "caught_up":
                    self.caught_up.set()
                elif message.event == "dropped":
                    break  # too far behind (a stalled terminal): open it again
                elif message.event != "ready":
                    self.recent.append(message.json())
        return True


def watch(
    poll: Callable[[], State], changes: PlanChanges, started: float, console: Console
) -> tuple[State, bool]:
    """Show progress until the plan has nothing left to do now; the last state, and
    whether it was interrupted (Ctrl-C)."""
    stop = {"now": False}

    def interrupt(*_: object) -> None:
        stop["now"] = True
        changes.changed.set()

    previous = signal.signal(signal.SIGINT, interrupt)
    display = LiveTable(console, started) if console.is_terminal else ProgressLines(started)
    state: State = {}
    try:
        with display:
            state = poll()
            while not stop["now"]:
                display.update(state)
                statuses = {t["status"] for t in state["tasks"]}
                if not statuses & set(WAITING):
                    break
                stopped = held(state["project"]) or not state["project"]["workers"]
                if stopped and not statuses & set(ACTIVE):
                    break
                if changes.wait(REDRAW_S) and not stop["now"]:
                    state = poll()
    finally:
        signal.signal(signal.SIGINT, previous)
    return state, stop["now"]


class LiveTable:
    """The tasks under way, redrawn in place (terminals only)."""

    def __init__(self, console: Console, started: float) -> None:
        self.started = started
        self.live = Live(console=console, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveTable:
        self.live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.live.__exit__(kind, exc, tb)

    def update(self, state: State) -> None:
        self.live.update(self.table(state))

    def table(self, state: State) -> Table:
        table = Table(title=f"corral tasks — {time.monotonic() - self.started:.0f}s")
        for column in ("task", "state", "step", "attempt", "elapsed", "cost"):
            table.add_column(column)
        now = time.time()
        for task in state["tasks"]:
            if task["status"] not in ACTIVE:
                continue
            began = _epoch(task["started_at"])
            table.add_row(
                task["id"],
                state_label(task),
                last_step(task),
                f"{task['attempts']}/{task['max_attempts']}",
                f"{now - began:.0f}s" if began else "",
                f"${task['cost_usd']:.2f}",
            )
        counts = state["project"]["counts"]
        table.caption = "  ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + (
            f"  cost: ${state['project']['cost_usd']:.2f}"
        )
        return table


class ProgressLines:
    """One plain line for each change of a task or of the plan, as it is seen."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.seen: dict[str, tuple[Any, ...]] = {}
        self.plan: tuple[Any, ...] | None = None

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, state: State) -> None:
        project = state["project"]
        if self.plan is None:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(project["counts"].items()))
            self._echo(f"plan: {len(state['tasks'])} tasks ({counts})")
        for task in state["tasks"]:
            mark = (task["status"], last_step(task), task["attempts"], task.get("interrupted"))
            before = self.seen.get(task["id"])
            self.seen[task["id"]] = mark
            if before is not None and before != mark:
                self._echo(f"{task['id']}: {_change(task)}")
        plan = (project["paused"], project.get("budget_reached"))
        if plan != self.plan and held(project):
            self._echo(f"plan held: {hold_reason(project)}; tasks under way finish, none start")
        self.plan = plan

    def _echo(self, text: str) -> None:
        click.echo(f"{time.monotonic() - self.started:6.1f}s  {text}")


def _change(task: dict[str, Any]) -> str:
    status = task["status"]
    text = "interrupted" if task.get("interrupted") else status
    if status == "claimed":
        text += f" (attempt {task['attempts']}/{task['max_attempts']})"
    elif status == "in_progress" and last_step(task):
        text += f", {last_step(task)} done"
    elif status == "completed":
        text += f" (${task['cost_usd']:.2f})"
    error = first_line(task["last_error"])
    if status == "ready" and task["attempts"] and error:
        text += f", to retry after attempt {task['attempts']}/{task['max_attempts']}: {error}"
    elif (status in FAILURES or status == "ready") and error:
        text += f": {error}"
    return text


def hold_reason(project: dict[str, Any]) -> str:
    if project["paused"]:
        return f"paused ({project['pause_reason'] or 'no reason given'})"
    return f"plan budget ${project['budget_usd']:.2f} reached (spent ${project['cost_usd']:.2f})"


def summary(console: Console, state: State, elapsed: float, interrupted: bool) -> int:
    """Print how the run ended; its exit status: 0 every task completed, 75 the plan is
    held with nothing failed, 1 otherwise (failures, conflicts, interrupted)."""
    project = state["project"]
    counts: dict[str, int] = project["counts"]
    total = sum(counts.values())
    done = counts.get("completed", 0)

    def say(text: str) -> None:
        console.print(text, soft_wrap=True)  # long lines stay whole, for logs and greps

    click.echo("")  # a line of its own, whatever the display left on the last one
    say(
        f"completed {done}/{total}, failed {counts.get('failed', 0)}, "
        f"conflicts {counts.get('merge_conflict', 0)}, "
        f"blocked by failure {counts.get('blocked_by_failure', 0)}, "
        f"duration {elapsed:.1f}s, cost ${project['cost_usd']:.2f}"
    )
    for task in state["tasks"]:
        if task["status"] in ("failed", "merge_conflict", "ready") and task["last_error"]:
            say(f"  {task['id']}: {colored(task['status'])} {first_line(task['last_error'])}")
        if task["worktree_kept"]:
            say(f"  {task['id']}: worktree kept (dirty): {task['worktree_kept']}")
    left = sum(counts.get(s, 0) for s in WAITING)
    if project["paused"] and left:
        say(
            f"[yellow]{hold_reason(project)}: {left} tasks wait. No task starts until "
            "`corral tasks resume`; then `corral tasks run` goes on.[/]"
        )
    elif project.get("budget_reached") and left:
        say(
            f"[yellow]{hold_reason(project)}: {left} tasks wait. Raise it to go on: "
            "`corral tasks run --budget USD`.[/]"
        )
    if interrupted:
        say("interrupted: run `corral tasks run` again to continue")
    if done == total:
        return 0
    if interrupted or any(counts.get(s, 0) for s in FAILURES):
        return 1
    return EXIT_PAUSED if held(project) else 1


def last_step(task: dict[str, Any]) -> str:
    steps = task["steps"] or {}
    for step in ("merging", "committed", "agent", "worktree"):
        if step in steps:
            return step
    return ""


def _epoch(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None
