"""``corral tasks``: plans of dependent tasks in the repository, run in parallel worktrees."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from corral.cli.embedded import (
    Embedded,
    run_in_progress,
    run_lock,
    runner_name,
    stop_dead_local_runners,
)
from corral.cli.options import URLS, comma_list, connect, given_token, option, token_option
from corral.cli.plan_progress import (
    ACTIVE,
    EXIT_PAUSED,
    PlanChanges,
    first_line,
    state_label,
    summary,
    watch,
)
from corral.client import Client, NewTask, Project, Task
from corral.dashboard.site import address as dashboard_address
from corral.errors import InvalidRequest
from corral.runner.settings import RunnerSettings
from corral.tasks.plan import load_plan

console = Console()


class Context:
    """Where the plan lives (repository, branch) and which coordinator holds it."""

    def __init__(self, repo: Path, branch: str, url: str | None, db: str | None) -> None:
        self.repo = repo
        self.branch = branch
        self.url = url
        self.db = db or str(repo / ".corral" / "corral.db")
        self.served: tuple[str, str | None] = ("", None)  # the coordinator's URL and token
        self.token: str | None = None  # the token this command uses

    @contextlib.contextmanager
    def client(self, runner: RunnerSettings | None = None) -> Iterator[Client]:
        if self.url:
            self.served = (self.url, None)
            self.token = given_token()
            with connect(self.url) as client:
                yield client
            return
        with (
            Embedded(self.db, runner=runner) as embedded,
            Client(embedded.url, token=embedded.token) as client,
        ):
            self.served = (embedded.url, embedded.token)
            self.token = embedded.token
            yield client

    def project(self, client: Client, **settings: Any) -> Project:
        return client.ensure_project(str(self.repo), self.branch, **settings)


def _git(repo: Path, *args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True)
    except OSError as exc:
        raise InvalidRequest(f"cannot run git: {exc.strerror}", code="no_git") from None
    except subprocess.CalledProcessError as exc:
        # git's own first line says which ("not a git repository", "ambiguous argument").
        said = first_line(exc.stderr.strip().removeprefix("fatal: "))
        raise InvalidRequest(
            f"{repo.resolve()} is not a git repository with a commit ({said}); run corral "
            "tasks inside one, or name it with --repo",
            code="not_a_repository",
        ) from None
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
    type=URLS,
    default=None,
    help="A coordinator to use, or several comma-separated (default: an embedded one on "
    "<repo>/.corral/corral.db).",
)
@option("--db", env="DB", default=None, help="Database of the embedded coordinator.")
@token_option
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
@click.option("--priority", type=int, default=0, show_default=True, help="Higher is claimed first.")
@click.option("--agent", default=None, help="Agent profile (default: claude).")
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Attempts in all: a failed task is retried (with backoff) until they are used up.",
)
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
    task = NewTask(
        id=key,
        title=title,
        prompt=prompt,
        priority=priority,
        agent=agent,
        max_attempts=max_attempts,
        after=[a.strip() for a in after.split(",") if a.strip()],
    )
    with obj.client() as client:
        client.add_tasks(obj.project(client).project_id, [task])
    click.echo(key)


@tasks.command("plan")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_obj
def plan(obj: Context, path: Path) -> None:
    """Import a plan file (YAML or TOML); importing it again changes nothing."""
    loaded = load_plan(path)
    if loaded.target_branch:
        obj.branch = loaded.target_branch
    new_tasks = [
        NewTask(
            id=t.key,
            title=t.title,
            prompt=t.prompt,
            after=list(t.after),
            priority=t.priority,
            labels=list(t.labels),
            agent=t.agent,
            max_attempts=t.max_attempts,
            budget_usd=t.budget_usd,
        )
        for t in loaded.tasks
    ]
    with obj.client() as client:
        project = obj.project(
            client,
            merge=loaded.merge,
            on_no_changes=loaded.on_no_changes,
            budget_usd=loaded.budget_usd,
        )
        result = client.add_tasks(project.project_id, new_tasks, digest=loaded.digest)
    click.echo(
        f"{len(result.created)} added, {len(result.updated)} updated, "
        f"{len(result.unchanged)} unchanged ({obj.branch})"
    )


@tasks.command("run")
@click.option(
    "--workers",
    type=click.IntRange(1, 256),
    default=4,
    show_default=True,
    help="Tasks run at once (agents side by side, each in its own worktree).",
)
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
    "--dashboard",
    "show_dashboard",
    is_flag=True,
    help="Print the address of a web dashboard of the plan while it runs (signed in).",
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
    show_dashboard: bool,
    sync_checkout: bool,
) -> None:
    """Work through the plan until every task is settled, or until the plan is paused or
    at its budget and the tasks under way have finished (a pause stops new claims only).

    Exit status: 0 every task completed; 75 the plan is paused (until `corral tasks
    resume`) or at its budget, nothing failed; 1 otherwise (failures, conflicts, Ctrl-C)."""
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
        pid = project.project_id
        if show_dashboard:
            # An embedded coordinator's token lives as long as this process: shown whole.
            # Of several coordinators, the one that answered (``obj.served`` has them all).
            address = dashboard_address(client.url, obj.served[1], page=f"/plans/{pid}")
            console.print(f"dashboard: {address}", soft_wrap=True, highlight=False)
        # A pause lasts until `tasks resume`: starting claims only if it is not paused.
        client.start_plan(pid, workers)
        with PlanChanges(client.coordinators, obj.token, pid) as changes:
            state, interrupted = watch(
                lambda: client.plan_status(pid).to_json(), changes, started, console
            )
        client.stop_plan(pid)
        state = client.plan_status(pid).to_json()
    code = summary(console, state, time.monotonic() - started, interrupted)
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
        # Printed whole (no wrapping): the command is meant to be copied.
        console.print(
            f"{obj.branch} moved on while it is checked out here, and corral left your files "
            "as they were: until you update them, `git status` shows the merged changes "
            "undone (staged), and a commit would undo them. Update your checkout (it keeps "
            "your own changes, and refuses if one would be overwritten):",
            soft_wrap=True,
        )
        console.print(f"    git read-tree -m -u {tip_before} {obj.branch}", soft_wrap=True)
        console.print("(or run with --sync-checkout to have it done at the end)", soft_wrap=True)
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


def _project_id(obj: Context, client: Client) -> str:
    return obj.project(client).project_id


def _plan_state(obj: Context) -> dict[str, Any]:
    """The plan's tasks. Without a coordinator of its own, a task under way while no
    ``tasks run`` is alive on this repository was left by one that died: interrupted."""
    with obj.client() as client:
        # plan_progress renders the API's JSON, and marks interrupted tasks in it
        state = client.plan_status(_project_id(obj, client)).to_json()
    if not obj.url and not run_in_progress(obj.repo):
        for task in state["tasks"]:
            task["interrupted"] = task.get("interrupted") or task["status"] in ACTIVE
    return state


@tasks.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def status(obj: Context, as_json: bool) -> None:
    """Every task with its state; the first line of its last error, whole."""
    state = _plan_state(obj)
    if as_json:
        click.echo(json.dumps(state, indent=2))
        return
    table = Table("task", "state", "after", "attempts", "cost")
    table.add_column("error", overflow="fold")  # wrapped, never cut: the end says most
    for task in state["tasks"]:
        table.add_row(
            task["id"],
            state_label(task),
            ",".join(task["after"]),
            f"{task['attempts']}/{task['max_attempts']}",
            f"${task['cost_usd']:.2f}",
            first_line(task["last_error"]),
        )
    console.print(table)
    if any(task.get("interrupted") for task in state["tasks"]):
        console.print(
            "interrupted: the run working on them is gone; `corral tasks run` picks them up again"
        )


@tasks.command("graph")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON: each task with its dependencies."
)
@click.pass_obj
def graph(obj: Context, as_json: bool) -> None:
    """The plan's dependency graph with each task's state."""
    state = _plan_state(obj)
    if as_json:
        nodes = [
            {"id": t["id"], "status": t["status"], "after": t["after"], "children": []}
            for t in state["tasks"]
        ]
        by_id = {node["id"]: node for node in nodes}
        for node in nodes:
            for blocker in node["after"]:
                by_id[blocker]["children"].append(node["id"])
        click.echo(json.dumps({"tasks": nodes}, indent=2))
        return
    children: dict[str, list[str]] = {}
    by_key = {t["id"]: t for t in state["tasks"]}
    for task in state["tasks"]:
        for blocker in task["after"]:
            children.setdefault(blocker, []).append(task["id"])
    tree = Tree(f"{obj.repo.name} → {obj.branch}")
    shown: set[str] = set()

    def add(node: Tree, key: str) -> None:
        task = by_key[key]
        label = f"{key} {state_label(task)}"
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


def _task_command(name: str, act: Callable[[Client, str, str], Task], doc: str) -> click.Command:
    @click.command(name, help=doc)
    @click.argument("key")
    @click.pass_obj
    def command(obj: Context, key: str) -> None:
        with obj.client() as client:
            task = act(client, _project_id(obj, client), key)
        click.echo(f"{key} {task.status}")

    return command


def _project_command(name: str, act: Callable[[Client, str], bool], doc: str) -> click.Command:
    @click.command(name, help=doc)
    @click.pass_obj
    def command(obj: Context) -> None:
        with obj.client() as client:
            act(client, _project_id(obj, client))
        click.echo(f"{obj.branch} {name}d")

    return command


tasks.add_command(
    _task_command("retry", Client.retry_task, "Retry a failed, conflicted or cancelled task.")
)
tasks.add_command(
    _task_command("cancel", Client.cancel_task, "Cancel a task; its dependents will not run.")
)
tasks.add_command(
    _project_command(
        "pause",
        Client.pause_plan,
        "Claim no new tasks until `corral tasks resume`. Tasks under way finish and are "
        f"merged; a `tasks run` then exits with status {EXIT_PAUSED}, and so does a new one.",
    )
)
tasks.add_command(
    _project_command(
        "resume", Client.resume_plan, "Claim tasks again (`corral tasks run` goes on)."
    )
)
