"""Task-graph benchmark: a plan of no-op agent tasks worked through by `corral tasks run`.

Each task's agent (the fake Claude CLI) writes one file; tasks form chains, so every task
but the first of a chain waits for a blocker. Measured from the step timings corral
records for every attempt:

  total        wall time of `corral tasks run`
  overhead     per task: claim → finished, minus the git steps (worktree, commit, merge)
               and the agent itself — what orchestration costs
  wake-up      a dependent's attempt start minus its last blocker's merge

    python benchmarks/graph.py [--tasks 200] [--chain 5] [--workers 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corral.store import Store

ROOT = Path(__file__).resolve().parent.parent
CORRAL = str(Path(sys.executable).parent / "corral")
FAKE_CLAUDE = str(ROOT / "tests" / "fakes" / "claude")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def make_repo(tmp: Path, tasks: int, chain: int) -> Path:
    repo = tmp / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.name", "bench")
    git(repo, "config", "user.email", "bench@localhost")
    (repo / "README").write_text("bench\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "init")
    lines = ["tasks:"]
    for i in range(tasks):
        lines += [
            f"  - id: t{i}",
            f"    title: task {i}",
            f'    prompt: "[fake:write=files/t{i}.txt:{i}]"',
        ]
        if i % chain:
            lines.append(f"    after: [t{i - 1}]")
    (tmp / "plan.yaml").write_text("\n".join(lines) + "\n")
    return repo


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--chain", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        repo = make_repo(tmp, args.tasks, args.chain)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLAUDECODE")}
        # The agents see the fake claude's home only if it is let through (--pass-env).
        env.update(FAKE_CLAUDE_HOME=str(tmp / "fake"), HOME=str(tmp), CORRAL_PASS_ENV="FAKE_*")
        subprocess.run(
            [CORRAL, "tasks", "plan", str(tmp / "plan.yaml")],
            cwd=repo,
            env=env,
            check=True,
            capture_output=True,
        )
        start = time.monotonic()
        done = subprocess.run(
            [CORRAL, "tasks", "run", "--workers", str(args.workers), "--claude-bin", FAKE_CLAUDE],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
        )
        total = time.monotonic() - start
        if done.returncode != 0:
            sys.exit(f"tasks run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        store = Store.open(str(repo / ".corral" / "corral.db"))
        project = store.projects.list()[0]
        tasks = {t.key: t for t in store.tasks.list(project.id)}
        store.close()

    overhead, wake, agent, gitwork = [], [], [], []
    for task in tasks.values():
        steps = task.steps
        worktree, agent_step = steps["worktree"], steps["agent"]
        committed, result = steps["committed"], steps["result"]
        assert isinstance(worktree, dict) and isinstance(agent_step, dict)
        assert isinstance(committed, dict) and isinstance(result, dict)
        git_s = worktree["seconds"] + committed["seconds"] + result["merge_seconds"]
        attempt_start = worktree["at"] - worktree["seconds"]
        assert task.started_at is not None and task.finished_at is not None
        overhead.append(task.finished_at - task.started_at - git_s - agent_step["seconds"])
        agent.append(agent_step["seconds"])
        gitwork.append(git_s)
        for blocker in task.blocked_by:
            blocker_result = tasks[blocker].steps["result"]
            assert isinstance(blocker_result, dict)
            wake.append(attempt_start - blocker_result["merged_at"])

    ms = 1000.0
    print(
        f"\ntask graph: {args.tasks} tasks in chains of {args.chain}, {args.workers} workers, "
        "SQLite, fake agent writing one file"
    )
    print(f"total {total:.1f} s ({args.tasks / total:.1f} tasks/s)")
    print(f"{'per task':<34} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for name, values in [
        ("agent (fake claude process)", agent),
        ("git (worktree + commit + merge)", gitwork),
        ("orchestration overhead", overhead),
        ("blocker merged -> dependent start", wake),
    ]:
        print(
            f"{name:<34} {pct(values, 50) * ms:>8.1f} {pct(values, 99) * ms:>8.1f} "
            f"{statistics.mean(values) * ms:>8.1f}"
        )


if __name__ == "__main__":
    main()
