"""Waiting for a run from the CLI: say why it waits, stream its output, survive a
coordinator restart, and end with an exit status that tells what happened.

Exit statuses of ``run --wait``, ``start --wait``, ``logs -f`` and ``wait``:
``0`` completed; the command's own exit status when it failed with one; ``1`` failed
without one (no such program, attempts used up); ``124`` timed out (as ``timeout(1)``);
``125`` cancelled; ``130`` Ctrl-C (the run goes on).
"""

from __future__ import annotations

import collections
import json
import sys
import time
from collections.abc import Callable

import click

from corral.cli.plan_progress import first_line
from corral.cli.transcript import Transcript
from corral.client import Client, LogLine, Run, Runner
from corral.errors import NotFound, Unavailable
from corral.runs import TERMINAL

EXIT_TIMED_OUT = 124
EXIT_CANCELLED = 125
EXIT_INTERRUPTED = 130
PENDING_POLL_S = 1.0  # a coordinator without GET /events is asked again this often
REPEAT_WAITING_S = 30.0  # a long wait says again why, so the last line never goes stale
RECONNECT_MAX_S = 5.0
TAIL_LINES = 5
TAIL_AFTER = 20  # more lines than this streamed: the last ones are shown again at a failure


def exit_status(run: Run) -> int:
    status = run.status
    if status == "completed":
        return 0
    if status == "timed_out":
        return EXIT_TIMED_OUT
    if status == "cancelled":
        return EXIT_CANCELLED
    code = run.exit_code
    return code if code is not None and 0 < code < 256 else 1


def label_text(labels: list[str]) -> str:
    return f"[{', '.join(labels)}]"


def waiting_reason(run: Run, runners: list[Runner], holder: str | None = None) -> str:
    """Why a pending run is not running yet, from what the coordinator knows of runners;
    ``holder``: the runner id holding a resumed session (only a runner of its name may
    take the resume)."""
    if holder is not None:
        return _holder_reason(runners, holder)
    labels = sorted(run.labels)
    live = [r for r in runners if r.state == "active"]
    wanted = f"a runner with labels {label_text(labels)}" if labels else "a runner"
    matching = [r for r in live if set(labels) <= set(r.labels)]
    if not live:
        return f"waiting for {wanted}: no runner is connected"
    if not matching:
        return f"waiting for {wanted}: no live runner has them"
    if all(r.slots_used >= r.slots_total for r in matching):
        return f"waiting for {wanted}: every slot of the {len(matching)} that match is busy"
    return f"waiting for {wanted} to claim it"


def _holder_reason(runners: list[Runner], holder: str) -> str:
    name = next((r.name for r in runners if r.runner_id == holder), holder)
    live = [r for r in runners if r.name == name and r.state == "active"]
    wanted = f"waiting for runner {name}, which holds the session"
    if not live:
        return f"{wanted}: it is not connected"
    if all(r.slots_used >= r.slots_total for r in live):
        return f"{wanted}: its slots are busy"
    return f"{wanted}, to claim it"


def no_match_warning(client: Client, labels: list[str]) -> str | None:
    """At submit time: a warning when no live runner could take a run with ``labels``."""
    live = [r for r in client.list_runners() if r.state == "active"]
    if not live:
        return "no runner is connected: the run waits until one is"
    if labels and not any(set(labels) <= set(r.labels) for r in live):
        return f"no live runner has labels {label_text(labels)}: the run waits until one does"
    return None


def line_printer(
    run_type: str, *, raw: bool = False, as_json: bool = False, split_streams: bool = True
) -> Callable[[LogLine], None]:
    """How a run's output lines are shown: as they are (a command's; ``--raw``), as JSON
    objects (``--json``), or an agent's stream-json as a readable transcript."""
    transcript = None if raw or as_json or run_type == "command" else Transcript()

    def show(item: LogLine) -> None:
        if as_json:
            click.echo(json.dumps(item.to_json()))
            return
        to_stderr = split_streams and item.stream == "stderr"
        texts = [item.text] if transcript is None else transcript.render(item.text)
        for text in texts:
            print(text, file=sys.stderr if to_stderr else sys.stdout, flush=True)

    return show


class Follower:
    """Follows one run to its end; ``stream`` prints its output as it comes."""

    def __init__(
        self,
        client: Client,
        run_id: str,
        *,
        stream: bool,
        split_streams: bool = True,  # a command's stderr lines to stderr (--wait)
        say: Callable[[str], None] | None = None,
        show: Callable[[LogLine], None] | None = None,
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.stream = stream
        self.say = say or (lambda text: click.echo(text, err=True))
        self.show = show or line_printer("command", split_streams=split_streams)
        self.connected = False
        self.status = "pending"
        self.after = 0
        self.printed = 0
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._said: tuple[str, float] | None = None

    def run(self) -> Run:
        """The finished run; Ctrl-C says how to cancel it and exits 130."""
        try:
            return self._follow()
        except KeyboardInterrupt:
            state = {"pending": "waiting", "lost": "lost"}.get(self.status, "running")
            self.say(
                f"{self.run_id} is still {state}; cancel it with `corral runs cancel {self.run_id}`"
            )
            raise SystemExit(EXIT_INTERRUPTED) from None

    def _follow(self) -> Run:
        while True:
            try:
                run = self.client.get_run(self.run_id)
                self.connected = True
                self.status = run.status
                if run.status == "pending":
                    self._waiting(run)
                    self._until_changed(run.status)
                    continue
                if run.status == "lost":
                    self._lost(run)
                if not self.stream and run.status not in TERMINAL:
                    self._until_changed(run.status)
                    continue
                ended = self._stream() if self.stream else run
            except Unavailable as exc:
                if not self.connected:  # never reached: a wrong URL, not a restart
                    raise
                self._reconnect(exc)
                continue
            if ended is not None:
                return ended

    def _stream(self) -> Run | None:
        """Print lines until the end (returned); None if the stream stopped short."""
        for item in self.client.follow_logs(self.run_id, self.after):
            if isinstance(item, Run):
                return item
            self.after = item.id
            self.printed += 1
            self.tail.append(item.text)
            self.show(item)
        return None  # the coordinator closed the stream (shutting down): follow again

    def _until_changed(self, status: str) -> None:
        """Until the run's status is not ``status``, told by the event stream (no polling);
        back at least every ``REPEAT_WAITING_S`` (the stream's keepalives come every 15 s),
        so a long wait says again why. A coordinator without the stream: a second's sleep."""
        until = time.monotonic() + REPEAT_WAITING_S
        try:
            for message in self.client.events(run_id=self.run_id, kind="run"):
                if message["event"] == "caught_up":
                    # What changed between our look and the stream's start is not in it.
                    if self.client.get_run(self.run_id).status != status:
                        return
                elif message["event"] == "run" and message["data"]["data"]["status"] != status:
                    return
                if time.monotonic() > until:
                    return
        except NotFound as exc:
            if exc.code != "route_not_found":
                raise
            time.sleep(PENDING_POLL_S)

    def _waiting(self, run: Run) -> None:
        self._tell(waiting_reason(run, self.client.list_runners(), self._holder(run)))

    def _lost(self, run: Run) -> None:
        """Its runner went with the run's last attempt: the run waits for that runner's
        report of it (a grace), then fails."""
        why = first_line(run.error)
        until = f" until {run.lost_until:%H:%M:%S} UTC" if run.lost_until else ""
        self._tell(
            f"lost ({why}): waiting{until} for its runner to report the attempt, else it fails"
        )

    def _tell(self, reason: str) -> None:
        """Say why the run waits, unless that was just said."""
        now = time.monotonic()
        if self._said and self._said[0] == reason and now - self._said[1] < REPEAT_WAITING_S:
            return
        self._said = (reason, now)
        self.say(f"{self.run_id} {reason}")

    def _holder(self, run: Run) -> str | None:
        """The runner holding the session a resume continues (None for other runs)."""
        if run.type != "resume_session" or not run.session_id:
            return None
        try:
            session = self.client.get_session(run.session_id)
        except NotFound:
            return None
        return session.runner_id

    def _reconnect(self, exc: Unavailable) -> None:
        self.say(f"{exc.message}; reconnecting (Ctrl-C to stop waiting)")
        delay = 0.2
        while True:
            time.sleep(delay)
            try:  # the run itself: a coordinator up but unable to answer (503) is not back
                self.client.get_run(self.run_id)
            except Unavailable:
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            self.say(f"reconnected to {self.client.url}")
            self._said = None
            return

    def report_end(self, run: Run) -> int:
        """The closing line (and a failure's reason); returns the exit status."""
        status = run.status
        if status == "completed":
            self.say(f"{self.run_id} completed")
            return 0
        if self.printed > TAIL_AFTER and self.tail:
            self.say("last lines:")
            for line in self.tail:
                self.say(f"  {line}")
        reason = run.error or ""
        self.say(f"{self.run_id} {status}" + (f": {reason}" if reason else ""))
        return exit_status(run)
