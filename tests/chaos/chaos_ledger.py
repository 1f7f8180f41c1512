"""The runs' own ledger, and the invariants the chaos soak checks against it.

Every run of the soak writes down what it did, as it happens, with the run id and attempt
its runner gave it (``CORRAL_RUN_ID``, ``CORRAL_RUN_ATTEMPT``):

* a command run appends ``start RUN ATTEMPT KEY TIME`` to the ledger file when it starts
  and ``done RUN ATTEMPT KEY TIME`` when its work is done (just before it exits);
* a fake Claude run appends ``start`` and ``finish`` JSON lines to its own ledger
  (``tests/fakes/claude``), its prompt holding the job's key.

``check`` compares that ledger with what corral says (the API's runs, and the run events
the database recorded) and with the faults the soak injected:

* nothing lost: every run the soak created is found, and once the soak has let the system
  settle, every one is final — in the status its job should end in (``completed`` for
  work that succeeds, ``failed`` with its exit code for work that fails, ``cancelled`` for
  a run cancelled while it ran); a completed or failed run's work was done by its last
  attempt (the ledger has that attempt's ``done``);
* nothing executed twice: no attempt of a run started twice; no attempt the API does not
  know of started; and a run started again (a later attempt after an earlier one had
  started) only after its lease provably expired while its runner was cut off — a
  ``lost`` event for the earlier attempt, naming a runner the soak had killed or cut off
  (or both coordinators down) at that time — and the earlier attempt never went on
  working beside the later one (its ``done`` after the later one's ``start``).
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The command each command job runs: ``sh -c SCRIPT KEY SECONDS EXIT_CODE``.
COMMAND_SCRIPT = (
    'echo "start $CORRAL_RUN_ID $CORRAL_RUN_ATTEMPT $0 $(date +%s.%N)" >> {ledger}; '
    "sleep $1; "
    'echo "done $CORRAL_RUN_ID $CORRAL_RUN_ATTEMPT $0 $(date +%s.%N)" >> {ledger}; '
    "exit $2"
)
PROMPT_KEY = re.compile(r"\bchaos (\S+)")
# How long after a fault's end the coordinator may still take back a run it caused to be
# lost: the lost-runner threshold, or a runner that came back without the run and the
# grace of a claim it never reported (``UNREPORTED_CLAIM_GRACE_S``), plus slack.
FAULT_AFTERMATH_S = 25.0


@dataclass(frozen=True)
class Entry:
    event: str  # "start" or "done"
    run_id: str
    attempt: int
    key: str
    at: float


@dataclass
class Job:
    """One run the soak asked for."""

    key: str
    kind: str
    want: str | None  # the final status it must end in (None: another check's business)
    exit_code: int | None
    at: float
    run_id: str | None = None  # None: the answer to its creation was lost
    cancel_at: float | None = None
    cancelled: bool = False  # the cancel was accepted


@dataclass(frozen=True)
class Disruption:
    """A fault that cuts a runner off (``runner``) or every runner (``None``)."""

    what: str
    runner: str | None
    start: float
    end: float


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    reexecuted: int = 0  # runs started again after a proven lease expiry
    final: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    never_created: int = 0  # creations whose answer was lost and that did not happen


def read_entries(command_ledger: Path, claude_ledger: Path) -> list[Entry]:
    entries = []
    if command_ledger.exists():
        for line in command_ledger.read_text().splitlines():
            words = line.split()
            if len(words) == 5:  # a line cut short by a kill is no entry
                event, run_id, attempt, key, at = words
                entries.append(Entry(event, run_id, int(attempt), key, float(at)))
    if claude_ledger.exists():
        for line in claude_ledger.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("event") not in ("start", "finish") or "run_id" not in record:
                continue
            key = _prompt_key(record["prompt"])
            if key is None:
                continue
            event = "start" if record["event"] == "start" else "done"
            entries.append(
                Entry(event, record["run_id"], int(record["attempt"]), key, record["ts"])
            )
    return entries


def job_key(run: dict[str, Any]) -> str | None:
    """The key of the job a run was created for (in its command, or its prompt)."""
    command = run.get("command") or []
    if len(command) >= 4 and command[0] == "sh":
        return str(command[3])
    return _prompt_key(run.get("prompt") or "")


def _prompt_key(prompt: str) -> str | None:
    """An agent job's prompt says ``chaos KEY …`` (a task's prompt may be wrapped)."""
    found = PROMPT_KEY.search(prompt)
    return found[1] if found else None


def check(
    jobs: list[Job],
    runs: dict[str, dict[str, Any]],
    entries: list[Entry],
    run_events: dict[str, list[dict[str, Any]]],
    runner_names: dict[str, str],
    disruptions: list[Disruption],
    *,
    settled: bool,
) -> Verdict:
    """The invariants over every job so far; ``settled``: the system was given time to
    finish everything, so every run must be final."""
    verdict = Verdict()
    v = verdict.violations
    by_key = {key: run for run in runs.values() if (key := job_key(run))}
    created = Counter(job_key(run) for run in runs.values())
    entries_of: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        entries_of[entry.run_id].append(entry)
    for job in jobs:
        run = runs.get(job.run_id) if job.run_id else by_key.get(job.key)
        if run is None:
            if job.run_id:
                v.append(f"{job.kind} run {job.run_id} ({job.key}) is gone from the API")
            elif settled:
                verdict.never_created += 1
            continue
        name = f"{job.kind} run {run['run_id']} ({job.key})"
        if created[job.key] > 1:  # its create sent again (idempotency key) made another
            v.append(f"{job.kind} job {job.key} has {created[job.key]} runs")
        mine = entries_of.get(run["run_id"], [])
        if any(e.key != job.key for e in mine):
            v.append(f"{name}: the ledger has work of another job under its run id")
        starts: dict[int, list[Entry]] = defaultdict(list)
        dones: dict[int, list[Entry]] = defaultdict(list)
        for e in mine:
            (starts if e.event == "start" else dones)[e.attempt].append(e)
        for attempt, found in starts.items():
            if len(found) > 1:
                v.append(f"{name}: attempt {attempt} started {len(found)} times")
            if attempt > run["attempts"]:
                v.append(f"{name}: attempt {attempt} ran, the API knows {run['attempts']}")
        executed = sorted(starts)
        for earlier, later in itertools.pairwise(executed):
            proof = _lease_expiry(
                run_events.get(run["run_id"], []), earlier, later, runner_names, disruptions
            )
            if proof is None:
                v.append(
                    f"{name}: attempt {later} started after attempt {earlier} had, with no "
                    "lease of it lost while its runner was cut off"
                )
            else:
                verdict.reexecuted += 1
            if dones.get(earlier) and dones[earlier][0].at > starts[later][0].at:
                v.append(f"{name}: attempt {earlier} went on working beside attempt {later}")
        if not settled:
            continue
        status = run["status"]
        if job.want is None:
            continue
        verdict.final[status] += 1
        if status != job.want:
            v.append(f"{name} ended {status}, not {job.want} (error: {run['error']!r})")
            continue
        if status in ("completed", "failed"):
            if not dones.get(run["attempts"]):
                v.append(f"{name} is {status}, but its attempt {run['attempts']} did no work")
            if job.exit_code is not None and run["exit_code"] != job.exit_code:
                v.append(f"{name} exited {run['exit_code']}, not {job.exit_code}")
    return verdict


def _lease_expiry(
    events: list[dict[str, Any]],
    earlier: int,
    later: int,
    runner_names: dict[str, str],
    disruptions: list[Disruption],
) -> str | None:
    """The proof that the lease of an attempt in ``[earlier, later)`` expired while its
    runner was cut off: a ``lost`` event of it whose runner the soak had disrupted then."""
    for event in events:
        data = event["data"]
        if data["status"] != "lost" or not earlier <= data["attempts"] < later:
            continue
        runner = runner_names.get(event["runner_id"] or "")
        for d in disruptions:
            if (d.runner is None or d.runner == runner) and (
                d.start <= event["at"] <= d.end + FAULT_AFTERMATH_S
            ):
                return f"{d.what} of {runner}"
    return None
