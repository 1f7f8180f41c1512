"""``corral tasks``: plans of dependent tasks in the repository, run in parallel worktrees."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.tree import Tree

from corral.cli.options import comma_list, option
from corral.client import CorralClient
from corral.errors import InvalidRequest
from corral.runner.settings import RunnerSettings
from corral.tasks.embedded import Embedded, run_lock, runner_name, stop_dead_local_runners
from corral.tasks.plan import load_plan

console = Console()
ACTIVE = ("claimed", "in_progress", "merging")
WAITING = ("ready", "blocked", *ACTIVE)
COLORS = {
    "completed": "green",
    "failed": "red",
    "merge_conflict": "red",
    "blocked_by_failure": "yellow",
    "cancelled": "yellow",
    "in_progress": "cyan",
    "merging": "magenta",
    "claimed": "cyan",
    "ready": "blue",
}


class Context:
    """Where the plan lives (repository, branch) and which coordinator holds it."""

    def __init__(self, repo: Path, branch: str, url: str | None, db: str | None) -> None:
        self.repo = repo
        self.branch = branch
        self.url = url
        self.db = db or str(repo / ".corral" / "corral.db")

    @contextlib.contextmanager
    def client(self, runner: RunnerSettings | None = None) -> Iterator[CorralClient]:
        if self.url:
            with CorralClient(self.url) as client:
                yield client
            return
        with Embedded(self.db, runner=runner) as embedded, CorralClient(embedded.url) as client:
            yield client

    def project(self, client: CorralClient, **settings: Any) -> dict[str, Any]:
        body = {"repo_path": str(self.repo), "target_branch": self.branch, **settings}
        project: dict[str, Any] = client.call(
            "POST", "/projects", json={k: v for k, v in body.items() if v is not None}
        )
        return project


def _git(repo: Path, *args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise InvalidRequest(f"{repo} is not a git repository with a commit ({exc})") from exc
    return out.stdout.strip()


@click.group()
@click.option(
    "--repo",
    type=click.Path(file_okay=False, path_type=Path),
    default=".",
    help="The repository (default: the one around the current directory).",
)
@option(
    "--branch",
    env="TARGET_BRANCH",
    default=None,
    help="Branch the tasks merge into (default: the repository's current branch).",
)
@option(
    "--url",
    env="URL",
    default=None,
    help="A coordinator to use (default: an embedded one on <repo>/.corral/corral.db).",
)
@option("--db", env="DB", default=None, help="Database of the embedded coordinator.")
@click.pass_context
def tasks(
    ctx: click.Context, repo: Path, branch: str | None, url: str | None, db: str | None
) -> None:
    """Plans of dependent tasks, each run by an agent in its own git worktree and merged."""
    top = Path(_git(repo, "rev-parse", "--show-toplevel")).resolve()
    target = branch or _git(top, "rev-parse", "--abbrev-ref", "HEAD")
    if target == "HEAD":
        raise InvalidRequest(
            "the repository has no current branch (detached HEAD): name the target with --branch"
        )
    ctx.obj = Context(top, target, url, db)


@tasks.command("add")
@click.argument("title")
@click.option("--id", "key", default=None, help="Task id (default: made from the title).")
@click.option("--prompt", default=None, help="What the agent is asked (default: the title).")
@click.option("--after", default="", help="Comma-separated ids this task waits for.")
@click.option("--priority", type=int, default=0)
@click.option("--agent", default=None)
@click.option("--max-attempts", type=int, default=3)
@click.pass_obj
def add(
    obj: Context,
    title: str,
    key: str | None,
    prompt: str | None,
    after: str,
    priority: int,
    agent: str | None,
    max_attempts: int,
) -> None:
    """Add one task."""
    key = key or re.sub(r"[^A-Za-z0-9._-]+", "-", title.lower()).strip("-.")[:64] or "task"
    task = {
        "id": key,
        "title": title,
        "prompt": prompt,
        "priority": priority,
        "agent": agent,
        "max_attempts": max_attempts,
        "after": [a.strip() for a in after.split(",") if a.strip()],
    }
    with obj.client() as client:
        project = obj.project(client)
        client.call(
            "POST",
            f"/projects/{project['project_id']}/tasks",
            json={"tasks": [{k: v for k, v in task.items() if v is not None}]},
        )
    click.echo(key)


@tasks.command("plan")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_obj
def plan(obj: Context, path: Path) -> None:
    """Import a plan file (YAML or TOML); importing it again changes nothing."""
    loaded = load_plan(path)
    if loaded.target_branch:
        obj.branch = loaded.target_branch
    tasks_json = [
        {
            "id": t.key,
            "title": t.title,
            "prompt": t.prompt,
            "after": list(t.after),
            "priority": t.priority,
            "labels": list(t.labels),
            "agent": t.agent,
            "max_attempts": t.max_attempts,
            "budget_usd": t.budget_usd,
        }
        for t in loaded.tasks
    ]
    with obj.client() as client:
        project = obj.project(
            client,
            merge=loaded.merge,
            on_no_changes=loaded.on_no_changes,
            budget_usd=loaded.budget_usd,
        )
        result = client.call(
            "POST",
            f"/projects/{project['project_id']}/tasks",
            json={
                "tasks": [{k: v for k, v in t.items() if v is not None} for t in tasks_json],
                "digest": loaded.digest,
            },
        )
    click.echo(
        f"{len(result['created'])} added, {len(result['updated'])} updated, "
        f"{len(result['unchanged'])} unchanged ({obj.branch})"
    )


@tasks.command("run")
@click.option("--workers", type=click.IntRange(1, 256), default=4, show_default=True)
@option("--claude-bin", env="CLAUDE_BIN", default="claude", help="The Claude Code executable.")
@option(
    "--pass-env",
    env="PASS_ENV",
    default="",
    help="Comma-separated names (fnmatch patterns) of this environment the agents may see "
    "beyond the allow-list (PATH, HOME, LANG, …); see `corral runner --help`.",
)
@click.option(
    "--budget",
    "budget_usd",
    type=float,
    default=None,
    help="Stop claiming new tasks once the plan has cost this much (USD).",
)
@click.option(
    "--retry-backoff",
    "retry_backoff_s",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds before a failed task's first retry, doubling after each failure "
    "(kept for the project; default: 2).",
)
@click.option(
    "--resolve-conflicts/--no-resolve-conflicts",
    default=None,
    help="Hand a task whose merge conflicts back to its agent once, with the conflict "
    "(kept for the project).",
)
@click.option(
    "--sync-checkout",
    is_flag=True,
    help="If the target branch is checked out here, bring its files up to date at the end "
    "(a two-way merge that keeps your local changes).",
)
@click.pass_obj
def run(
    obj: Context,
    workers: int,
    claude_bin: str,
    pass_env: str,
    budget_usd: float | None,
    retry_backoff_s: float | None,
    resolve_conflicts: bool | None,
    sync_checkout: bool,
) -> None:
    """Work through the plan until every task is settled; exits 0 if all completed."""
    started = time.monotonic()
    tip_before = _git(obj.repo, "rev-parse", f"refs/heads/{obj.branch}")
    runner = (
        None
        if obj.url
        else RunnerSettings(
            name=runner_name(obj.repo),
            slots=workers,
            claude_bin=claude_bin,
            drain_grace_s=0.0,
            pass_env=comma_list(pass_env),
        )
    )
    with contextlib.ExitStack() as stack:
        if runner is not None:
            stack.enter_context(run_lock(obj.repo))
            stop_dead_local_runners(obj.db, obj.repo, time.time())
        client = stack.enter_context(obj.client(runner))
        project = obj.project(
            client,
            budget_usd=budget_usd,
            retry_backoff_s=retry_backoff_s,
            resolve_conflicts=resolve_conflicts,
        )
        pid = project["project_id"]
        client.call("POST", f"/projects/{pid}/resume")
        client.call("POST", f"/projects/{pid}/start", json={"workers": workers})
        interrupted = _watch(client, pid, started)
        client.call("POST", f"/projects/{pid}/stop")
        state = client.call("GET", f"/projects/{pid}/tasks")
    code = _summary(state, time.monotonic() - started, interrupted)
    _checkout_note(obj, tip_before, sync_checkout)
    raise SystemExit(code)


def _checkout_note(obj: Context, tip_before: str, sync: bool) -> None:
    """The merges moved the target branch; the user's own checkout of it was not touched."""
    tip = _git(obj.repo, "rev-parse", f"refs/heads/{obj.branch}")
    head = subprocess.run(
        ["git", "symbolic-ref", "-q", "HEAD"], cwd=obj.repo, capture_output=True, text=True
    ).stdout.strip()
    if tip == tip_before or head != f"refs/heads/{obj.branch}":
        return
    if not sync:
        console.print(
            f"{obj.branch} moved on while it is checked out here; your files were left as "
            f"they were. To update them: git read-tree -m -u {tip_before[:12]} {obj.branch} "
            "(or run with --sync-checkout)"
        )
        return
    done = subprocess.run(
        ["git", "read-tree", "-m", "-u", tip_before, tip],
        cwd=obj.repo,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        console.print(f"[yellow]could not update your checkout: {done.stderr.strip()}[/]")
    else:
        console.print(f"updated your checkout of {obj.branch} to {tip[:12]}")


def _watch(client: CorralClient, pid: str, started: float) -> bool:
    """Show progress until nothing is left to do; True if interrupted (Ctrl-C)."""
    stop = {"now": False}
    previous = signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    try:
        with Live(console=console, refresh_per_second=4, transient=False) as live:
            while not stop["now"]:
                state = client.call("GET", f"/projects/{pid}/tasks")
                live.update(_progress(state, started))
                statuses = {t["status"] for t in state["tasks"]}
                if state["project"]["paused"] or not statuses & set(WAITING):
                    break
                time.sleep(0.2)
    finally:
        signal.signal(signal.SIGINT, previous)
    return stop["now"]


def _progress(state: dict[str, Any], started: float) -> Table:
    table = Table(title=f"corral tasks — {time.monotonic() - started:.0f}s")
    for column in ("task", "state", "step", "attempt", "elapsed", "cost"):
        table.add_column(column)
    now = time.time()
    for task in state["tasks"]:
        if task["status"] not in ACTIVE:
            continue
        began = _epoch(task["started_at"])
        table.add_row(
            task["id"],
            _colored(task["status"]),
            _last_step(task),
            f"{task['attempts']}/{task['max_attempts']}",
            f"{now - began:.0f}s" if began else "",
            f"${task['cost_usd']:.2f}",
        )
    counts = state["project"]["counts"]
    table.caption = "  ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + (
        f"  cost: ${state['project']['cost_usd']:.2f}"
    )
    return table


def _summary(state: dict[str, Any], elapsed: float, interrupted: bool) -> int:
    counts: dict[str, int] = state["project"]["counts"]
    total = sum(counts.values())
    done = counts.get("completed", 0)
    console.print(
        f"completed {done}/{total}, failed {counts.get('failed', 0)}, "
        f"conflicts {counts.get('merge_conflict', 0)}, "
        f"blocked by failure {counts.get('blocked_by_failure', 0)}, "
        f"duration {elapsed:.1f}s, cost ${state['project']['cost_usd']:.2f}"
    )
    for task in state["tasks"]:
        if task["status"] in ("failed", "merge_conflict"):
            console.print(f"  {task['id']}: {_colored(task['status'])} {task['last_error'] or ''}")
        if task["worktree_kept"]:
            console.print(f"  {task['id']}: worktree kept (dirty): {task['worktree_kept']}")
    if state["project"]["paused"]:
        console.print(f"[yellow]paused: {state['project']['pause_reason']}[/]")
    if interrupted:
        console.print("interrupted: run `corral tasks run` again to continue")
    return 0 if done == total and not interrupted else 1


def _last_step(task: dict[str, Any]) -> str:
    steps = task["steps"] or {}
    for step in ("merging", "committed", "agent", "worktree"):
        if step in steps:
            return step
    return ""


def _epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def _colored(status: str) -> str:
    color = COLORS.get(status)
    return f"[{color}]{status}[/]" if color else status


def _project_id(obj: Context, client: CorralClient) -> str:
    return str(obj.project(client)["project_id"])


@tasks.command("status")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def status(obj: Context, as_json: bool) -> None:
    """Every task with its state."""
    with obj.client() as client:
        state = client.call("GET", f"/projects/{_project_id(obj, client)}/tasks")
    if as_json:
        import json

        click.echo(json.dumps(state, indent=2))
        return
    table = Table("task", "state", "after", "attempts", "cost", "error")
    for task in state["tasks"]:
        table.add_row(
            task["id"],
            _colored(task["status"]),
            ",".join(task["after"]),
            f"{task['attempts']}/{task['max_attempts']}",
            f"${task['cost_usd']:.2f}",
            (task["last_error"] or "")[:60],
        )
    console.print(table)


@tasks.command("graph")
@click.pass_obj
def graph(obj: Context) -> None:
    """The plan's dependency graph with each task's state."""
    with obj.client() as client:
        state = client.call("GET", f"/projects/{_project_id(obj, client)}/tasks")
    children: dict[str, list[str]] = {}
    by_key = {t["id"]: t for t in state["tasks"]}
    for task in state["tasks"]:
        for blocker in task["after"]:
            children.setdefault(blocker, []).append(task["id"])
    tree = Tree(f"{obj.repo.name} → {obj.branch}")
    shown: set[str] = set()

    def add(node: Tree, key: str) -> None:
        task = by_key[key]
        label = f"{key} {_colored(task['status'])}"
        if key in shown:
            node.add(f"{label} [dim](above)[/]")
            return
        shown.add(key)
        branch = node.add(label)
        for child in children.get(key, []):
            add(branch, child)

    for task in state["tasks"]:
        if not task["after"]:
            add(tree, task["id"])
    console.print(tree)


def _task_command(name: str, doc: str) -> click.Command:
    @click.command(name, help=doc)
    @click.argument("key")
    @click.pass_obj
    def command(obj: Context, key: str) -> None:
        with obj.client() as client:
            task = client.call("POST", f"/projects/{_project_id(obj, client)}/tasks/{key}/{name}")
        click.echo(f"{key} {task['status']}")

    return command


def _project_command(name: str, doc: str) -> click.Command:
    @click.command(name, help=doc)
    @click.pass_obj
    def command(obj: Context) -> None:
        with obj.client() as client:
            client.call("POST", f"/projects/{_project_id(obj, client)}/{name}")
        click.echo(f"{obj.branch} {name}d")

    return command


tasks.add_command(_task_command("retry", "Retry a failed, conflicted or cancelled task."))
tasks.add_command(_task_command("cancel", "Cancel a task; its dependents will not run."))
tasks.add_command(_project_command("pause", "Claim no new tasks until resumed."))
tasks.add_command(_project_command("resume", "Claim tasks again."))
