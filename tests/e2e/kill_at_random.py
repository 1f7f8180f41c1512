"""Kill ``corral tasks run`` with SIGKILL at random instants, run it again, check it lost nothing.

A plan of ten tasks (independent ones, dependents, two that conflict, one that fails once)
runs in a real git repository through the real CLI and the fake Claude. Each round starts
``tasks run`` and SIGKILLs its whole process group after a random delay; rounds go on until
a run ends by itself. git is slowed where it matters, so that kills land inside it: a
smudge/clean filter that sleeps (``*.slow`` files, which every task writes), and hooks
that sleep (``post-checkout``, ``pre-commit``, ``post-merge``, and ``reference-transaction``
while git holds its ref locks) — inside ``worktree add``, ``add``/``commit``, ``merge``
and ``update-ref``.

After every round (``check``):

* no file lost: every file of the base commit is on the target branch, unchanged;
* exactly the completed tasks' changes: each completed task's files are there, byte for
  byte; a task that did not complete left nothing (one still under way may be merged
  already, but whole); no file that no task wrote; no conflict markers;
* each merge once: one task commit and one merge commit per merged task;
* no finished agent ran again: once corral has a task's agent result on disk (its journal
  or its step record), the fake Claude's ledger shows no new start of that agent;
* the user's checkout (files and index) is byte-identical.

When the plan ends, every task is settled as it should be: all completed but the losing
one of the conflicting pair (``merge_conflict``) and what depends on it.

Variants: two ``tasks run`` started at once (one must refuse, exit 4 ``plan_running``),
and ``git gc --prune=now`` / ``git worktree prune`` run by the user between two rounds.

    python tests/e2e/kill_at_random.py --kills 500 [--seed N] [--max-delay 6]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tasks_helpers import TaskRepo

SETTLED = frozenset({"completed", "failed", "merge_conflict", "blocked_by_failure", "cancelled"})
NOT_MERGED = frozenset({"failed", "merge_conflict", "blocked_by_failure", "blocked", "cancelled"})
MARKERS = re.compile(rb"^(<<<<<<<|>>>>>>>)( |$)", re.MULTILINE)
REFUSED = "another `corral tasks run` is working on"
GIT_STEPS = ("worktree add", "add", "commit", "merge", "update-ref", "checkout", "reset")


@dataclass(frozen=True)
class Slowness:
    """Seconds git sleeps in the filter (per file) and in each hook."""

    filter_s: float = 0.02
    hook_s: float = 0.05


@dataclass(frozen=True)
class Spec:
    key: str
    files: dict[str, str]
    after: tuple[str, ...] = ()
    directive: str = ""  # e.g. "[fake:fail_once]"

    @property
    def prompt(self) -> str:
        writes = "".join(
            f"[fake:write={path}:{text.replace(chr(10), chr(92) + 'n')}]"
            for path, text in self.files.items()
        )
        return f"Task {self.key}. {self.directive}{writes}"


def own_files(key: str) -> dict[str, str]:
    return {f"files/{key}.txt": f"made by {key}\n", f"files/{key}.slow": f"slow {key}\n"}


PLAN = (
    Spec("a1", own_files("a1")),
    Spec("a2", own_files("a2")),
    Spec("a3", own_files("a3")),
    Spec("a4", own_files("a4")),
    Spec("f1", own_files("f1"), directive="[fake:fail_once]"),
    Spec("b1", own_files("b1"), after=("a1",)),
    Spec("b2", own_files("b2"), after=("a2", "f1")),
    Spec("c1", {**own_files("c1"), "conflict.slow": "the c1 version\n"}),
    Spec("c2", {**own_files("c2"), "conflict.slow": "the c2 version\n"}),
    Spec("d1", own_files("d1"), after=("c1",)),
)
CONFLICTING = ("c1", "c2")
BASE_FILES = {
    **{f"base/{n:02}.txt": f"base file {n}\n" for n in range(12)},
    **{f"base/{n:02}.slow": f"slow base file {n}\n" for n in range(12)},
}


@dataclass
class Figures:
    plans: int = 0
    rounds: int = 0
    kills: int = 0
    kills_in: Counter[str] = field(default_factory=Counter)  # git step in flight at a kill
    concurrent_refusals: int = 0
    gc_rounds: int = 0
    lost_results: int = 0  # agents run again: their result died with the kill, unread
    violations: list[str] = field(default_factory=list)

    def line(self) -> str:
        inside = ", ".join(f"{step} {n}" for step, n in sorted(self.kills_in.items()))
        return (
            f"plans {self.plans}, rounds {self.rounds}, kills {self.kills} (git in flight: "
            f"{inside or 'none'}), concurrent refusals {self.concurrent_refusals}, "
            f"gc/prune rounds {self.gc_rounds}, agent results lost unread in a kill "
            f"{self.lost_results}, violations {len(self.violations)}"
        )


class PlanUnderFire:
    """One plan in a fresh repository, run round after round until it ends."""

    def __init__(self, root: Path, rng: random.Random, slowness: Slowness, workers: int) -> None:
        self.rng = rng
        self.workers = workers
        self.tr = TaskRepo(root)
        self._slow_git(slowness)
        for path, text in BASE_FILES.items():
            (self.tr.repo / path).parent.mkdir(parents=True, exist_ok=True)
            (self.tr.repo / path).write_text(text)
        self.tr.git("add", "-A")
        self.tr.git("commit", "-q", "-m", "base files")
        self.base = self.files_on("main")
        plan = [
            {"id": s.key, "title": f"Task {s.key}", "prompt": s.prompt, "after": list(s.after)}
            for s in PLAN
        ]
        path = self.tr.write_plan({"target_branch": "main", "tasks": plan})
        imported = self.tr.corral("plan", str(path))
        assert imported.code == 0, str(imported)
        self.checkout = self.checkout_state()
        self.known_results: dict[str, int] = {}  # prompt → its starts when corral had its result
        self.seen_lost: set[str] = set()

    def _slow_git(self, slowness: Slowness) -> None:
        tr = self.tr
        script = tr.root / "slow-filter.sh"
        script.write_text(f"#!/bin/sh\nsleep {slowness.filter_s}\nexec cat\n")
        script.chmod(0o755)
        tr.git("config", "filter.slow.clean", str(script))
        tr.git("config", "filter.slow.smudge", str(script))
        (tr.repo / ".gitattributes").write_text("*.slow filter=slow\n")
        hooks = tr.repo / ".git" / "hooks"
        for name in ("post-checkout", "pre-commit", "post-merge"):
            (hooks / name).write_text(f"#!/bin/sh\nsleep {slowness.hook_s}\n")
        (hooks / "reference-transaction").write_text(
            f'#!/bin/sh\ncat >/dev/null\n[ "$1" = prepared ] && sleep {slowness.hook_s}\nexit 0\n'
        )
        for hook in hooks.iterdir():
            hook.chmod(0o755)

    # -- rounds ---------------------------------------------------------------------------

    def run_args(self) -> list[str]:
        return [
            "run",
            "--workers",
            str(self.workers),
            "--retry-backoff",
            "0.2",
            "--no-resolve-conflicts",
        ]

    def round(self, kill_after: float | None, figures: Figures, timeout: float = 180.0) -> bool:
        """One ``tasks run``, SIGKILLed after ``kill_after`` seconds; True if it ended itself."""
        proc = self.tr.start(*self.run_args())
        figures.rounds += 1
        try:
            proc.wait(timeout=kill_after if kill_after is not None else timeout)
        except subprocess.TimeoutExpired:
            if kill_after is None:
                figures.violations.append(f"tasks run did not end within {timeout}s")
            figures.kills_in.update(git_steps_in_group(proc.pid))
            self.tr.kill_group(proc)
            figures.kills += 1
            return False
        return True

    def concurrent_round(self, kill_after: float, figures: Figures) -> bool:
        """Two ``tasks run`` at once: one refuses, the other works until killed after
        ``kill_after`` seconds; True if the plan ended first."""
        log = self.tr.root / "corral-background.log"
        log_at = log.stat().st_size if log.exists() else 0
        procs = [self.tr.start(*self.run_args()), self.tr.start(*self.run_args())]
        figures.rounds += 1
        started = time.monotonic()
        deadline = started + 180.0
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        done = [p for p in procs if p.poll() is not None]
        if not done:
            figures.violations.append("neither of two concurrent tasks run ended")
            for p in procs:
                self.tr.kill_group(p)
            return False
        refused, other = done[0], next(p for p in procs if p is not done[0])
        said = log.read_bytes()[log_at:]
        if refused.returncode != 4 or REFUSED.encode() not in said or b"Traceback" in said:
            figures.violations.append(
                f"of two concurrent tasks run, the first to end exited {refused.returncode} "
                "without refusing cleanly (plan_running, no traceback)"
            )
        else:
            figures.concurrent_refusals += 1
        try:
            other.wait(timeout=max(0.0, started + kill_after - time.monotonic()))
        except subprocess.TimeoutExpired:
            figures.kills_in.update(git_steps_in_group(other.pid))
            self.tr.kill_group(other)
            figures.kills += 1
            return False
        return True

    def users_maintenance(self, figures: Figures) -> None:
        """What a user may run between two runs."""
        self.tr.git("gc", "--quiet", "--prune=now", check=False)
        self.tr.git("worktree", "prune")
        figures.gc_rounds += 1

    # -- invariants ---------------------------------------------------------------------------

    def note_results(self, figures: Figures) -> None:
        """After a kill: the agents whose results corral kept, and those it lost unread."""
        with self.tr.store() as store:
            steps = {k: t.steps for k, t in self.tr.db_tasks(store).items()}
        journal = self.tr.repo / ".corral" / "journal"
        kept = {k for k, s in steps.items() if "agent" in s}
        kept |= {p.stem for p in journal.glob("*.json")} if journal.is_dir() else set()
        starts = self.starts()
        for spec in PLAN:
            if spec.key in kept and spec.prompt not in self.known_results:
                self.known_results[spec.prompt] = starts[spec.prompt]

    def starts(self) -> Counter[str]:
        return Counter(e["prompt"] for e in self.tr.ledger_events() if e["event"] == "start")

    def check(self, figures: Figures, *, final: bool) -> None:
        v = figures.violations
        with self.tr.store() as store:
            statuses = {k: str(t.status) for k, t in self.tr.db_tasks(store).items()}
        main = self.files_on("main")
        for path, data in self.base.items():
            if main.get(path) != data:
                v.append(f"base file {path} lost or changed on main")
        # Merges on main, latest first: a file two merged tasks wrote holds the later one's.
        merged_order = [
            line.split()[2]
            for line in self.tr.git("log", "--first-parent", "--format=%s", "main").splitlines()
            if line.startswith("corral: merge ")
        ]
        writers: dict[str, list[Spec]] = {}
        for spec in PLAN:
            for path in spec.files:
                writers.setdefault(path, []).append(spec)
        for path, specs in writers.items():
            merged = [spec for spec in specs if spec.key in merged_order]
            merged.sort(key=lambda spec: merged_order.index(spec.key))
            want = merged[0].files[path].encode() if merged else self.base.get(path)
            if main.get(path) != want:
                v.append(f"{path} on main is {main.get(path)!r}, not {want!r}")
        for spec in PLAN:
            status, is_merged = statuses[spec.key], spec.key in merged_order
            if status == "completed" and not is_merged:
                v.append(f"{spec.key} completed but not merged into main")
            if status in NOT_MERGED and is_merged:
                v.append(f"{spec.key} is {status} but merged into main")
        for path in set(main) - set(self.base) - set(writers):
            v.append(f"main holds {path}, which no task wrote")
        for path, data in main.items():
            if MARKERS.search(data):
                v.append(f"conflict markers in {path} on main")
        subjects = Counter(self.tr.subjects())
        for spec in PLAN:
            merges = subjects[f"corral: merge {spec.key} Task {spec.key}"]
            commits = subjects[f"corral: {spec.key} Task {spec.key}"]
            want = (1,) if statuses[spec.key] == "completed" else (0, 1)
            if merges not in want or commits not in want:
                v.append(f"{spec.key} ({statuses[spec.key]}): {commits} commits, {merges} merges")
        if self.checkout_state() != self.checkout:
            v.append("the user's checkout changed")
        starts = self.starts()
        finishes = Counter(
            e["prompt"]
            for e in self.tr.ledger_events()
            if e["event"] == "finish" and not e["is_error"]
        )
        for prompt, count in self.known_results.items():
            if starts[prompt] != count:
                v.append(f"an agent ran again after corral had its result: {prompt[:40]}")
        for prompt, n in finishes.items():
            if n > 1 and prompt not in self.seen_lost:
                self.seen_lost.add(prompt)
                figures.lost_results += n - 1
        if final:
            self.check_final(statuses, v)

    def check_final(self, statuses: dict[str, str], v: list[str]) -> None:
        waiting = {k: s for k, s in statuses.items() if s not in SETTLED}
        if waiting:
            v.append(f"the plan ended with tasks not settled: {waiting}")
        # Both complete when one started after the other was merged (kills shift timing).
        pair = sorted(statuses[k] for k in CONFLICTING)
        if pair not in (["completed", "merge_conflict"], ["completed", "completed"]):
            v.append(f"the conflicting pair ended {pair}")
        lost = {k for k in CONFLICTING if statuses[k] != "completed"}
        for spec in PLAN:
            if spec.key in CONFLICTING:
                continue
            want = "blocked_by_failure" if lost & set(spec.after) else "completed"
            if statuses[spec.key] != want:
                v.append(f"{spec.key} ended {statuses[spec.key]}, not {want}")

    def files_on(self, ref: str) -> dict[str, bytes]:
        listing = self.tr.git("ls-tree", "-r", "-z", ref).split("\0")
        entries = [line.split("\t", 1) for line in listing if line]
        shas = [meta.split()[2] for meta, _ in entries]
        blobs = subprocess.run(
            ["git", "cat-file", "--batch"],
            cwd=self.tr.repo,
            env=self.tr.env,
            input="".join(f"{sha}\n" for sha in shas).encode(),
            capture_output=True,
            check=True,
        ).stdout
        found, at = {}, 0
        for (_, path), _sha in zip(entries, shas, strict=True):
            header_end = blobs.index(b"\n", at)
            size = int(blobs[at:header_end].split()[2])
            found[path] = blobs[header_end + 1 : header_end + 1 + size]
            at = header_end + 1 + size + 1
        return found

    def checkout_state(self) -> tuple[dict[str, bytes], bytes]:
        return self.tr.checkout_snapshot(), (self.tr.repo / ".git" / "index").read_bytes()


def git_steps_in_group(pgid: int) -> list[str]:
    """The git commands running in the process group ``pgid`` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ProcessLookupError):
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        if not words or Path(words[0]).name != "git":
            continue
        verbs = [w for w in words[1:] if not w.startswith("-")]
        if words[1:2] == ["-C"]:
            verbs = [w for w in words[3:] if not w.startswith("-")]
        for step in GIT_STEPS:
            if " ".join(verbs[: len(step.split())]) == step:
                found.append(step)
                break
    return found


def run_plan(
    root: Path,
    rng: random.Random,
    figures: Figures,
    *,
    max_kills: int,
    max_delay: float,
    slowness: Slowness,
    workers: int = 3,
    concurrent: bool = False,
    maintenance: bool = False,
) -> None:
    """One plan under fire: up to ``max_kills`` random kills, then run to its end."""
    plan = PlanUnderFire(root, rng, slowness, workers)
    figures.plans += 1
    kills = 0
    while True:
        delay = rng.uniform(0.0, max_delay) if kills < max_kills else None
        if concurrent and delay is not None:
            concurrent = False  # the first round: two at once, the one left killed as usual
            ended = plan.concurrent_round(delay, figures)
        else:
            ended = plan.round(delay, figures)
        kills += int(not ended)
        if not ended:
            plan.note_results(figures)
            if maintenance and kills == max(1, max_kills // 2):
                plan.users_maintenance(figures)
        plan.check(figures, final=ended)
        if ended:
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=500, help="kills in all (default 500)")
    parser.add_argument("--kills-per-plan", type=int, default=10)
    parser.add_argument("--max-delay", type=float, default=6.0, help="longest delay to a kill")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep each plan's directory")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    figures = Figures()
    started = time.monotonic()
    print(f"seed {seed}", flush=True)
    while figures.kills < args.kills:
        with tempfile.TemporaryDirectory(prefix="corral-kill-") as tmp:
            before = len(figures.violations)
            try:
                run_plan(
                    Path(tmp),
                    rng,
                    figures,
                    max_kills=args.kills_per_plan,
                    max_delay=args.max_delay,
                    slowness=Slowness(),
                    workers=args.workers,
                    concurrent=figures.plans % 3 == 1,
                    maintenance=figures.plans % 3 == 2,
                )
            except AssertionError as exc:  # a git command of the checks failed
                figures.violations.append(f"cannot check the plan: {exc}")
            for violation in figures.violations[before:]:
                print(f"VIOLATION (plan {figures.plans}): {violation}", flush=True)
            if args.keep or len(figures.violations) > before:
                kept = Path(tempfile.mkdtemp(prefix="corral-kill-kept-"))
                subprocess.run(["cp", "-a", f"{tmp}/.", str(kept)], check=False)
                print(f"  kept in {kept}", flush=True)
        print(f"[{time.monotonic() - started:.0f}s] {figures.line()}", flush=True)
    print(json.dumps({"seed": seed, "summary": figures.line()}))
    return 1 if figures.violations else 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
