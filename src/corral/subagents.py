"""Sub-agent sessions: which children a parent session may start, and how their results
come back to it. Pure decisions (no I/O, no clock): the store and the coordinator carry
them out.

A run may name a ``parent_session`` and a callback mode (seed 001's MCP server has the
same three):

    sync            the tool call that started the child waits for its result
    async_poll      the call answers at once with the run; the parent polls
    async_callback  the call answers at once; when the child ends, the parent session is
                    resumed with a message carrying the child's result

A child is a session (a start or a resume of one) or a command: a command starts no
session, so it has no children and no depth limit holds it; its parent hears of its exit
code and the last lines of its output.

Callbacks are delivered once, and batched: every child of a parent that ended while the
parent was busy (its own run not finished) comes back in one resume, started when the
parent is idle again. Delivery is planned here (``plan_deliveries``); exactly once is the
store's part: the resume run and the marks of the callbacks it delivers are written in one
transaction, so a coordinator killed between a child's end and its parent's resume plans
the same delivery again, and one that had written it finds nothing left to deliver.

A parent whose session is gone (deleted, never recorded) or failed cannot be resumed: its
pending callbacks are dropped with the code ``parent_gone``, never left to wait forever.
Nor can one whose children spent its budget (the budget covers them): ``budget_exceeded``.
"""

from __future__ import annotations

import enum
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from corral.errors import Conflict, InvalidRequest

# Of a command child's output, the last lines its parent is resumed with.
CALLBACK_OUTPUT_LINES = 20


class Mode(enum.StrEnum):
    SYNC = "sync"
    ASYNC_POLL = "async_poll"
    ASYNC_CALLBACK = "async_callback"


@dataclass(frozen=True)
class Limits:
    """How deep sessions may nest and how many unfinished children one may have."""

    max_depth: int = 3  # a root session is depth 0; its children 1 …
    max_children: int = 8  # unfinished children of one parent at once
    max_batch: int = 20  # children's results in one resume of the parent


@dataclass(frozen=True)
class Parent:
    """What the coordinator knows of a would-be parent session when a child is asked for."""

    session_id: str
    depth: int
    active_children: int
    # The parent's budget covers its children: what it and every descendant cost so far.
    budget_usd: float | None = None
    cost_with_children_usd: float = 0.0


def check_spawn(parent: Parent, limits: Limits, *, nests: bool = True) -> int:
    """The child's depth, or the refusal (its stable code) of a child ``parent`` may not
    start: too deep, too many unfinished children, or the parent's budget spent. A child
    that ``nests`` not (a command: it starts no session, so has no children) is as deep as
    any: only the fan-out and the budget hold it back."""
    depth = parent.depth + 1
    if nests and depth > limits.max_depth:
        raise InvalidRequest(
            f"session {parent.session_id} is at depth {parent.depth}: a child would be "
            f"deeper than {limits.max_depth}",
            code="depth_exceeded",
        )
    if parent.active_children >= limits.max_children:
        raise Conflict(
            f"session {parent.session_id} has {parent.active_children} unfinished children "
            f"(at most {limits.max_children}): wait for one to end",
            code="fan_out_exceeded",
        )
    budget = parent.budget_usd
    if budget is not None and parent.cost_with_children_usd >= budget:
        raise Conflict(
            f"session {parent.session_id} and its children cost "
            f"${parent.cost_with_children_usd:.4f} of its ${budget:.4f} budget",
            code="budget_exceeded",
        )
    return depth


@dataclass(frozen=True)
class ChildResult:
    """How a child ended, as its parent is told."""

    run_id: str
    session_name: str | None
    session_id: str | None
    status: str
    result: str | None
    error: str | None
    cost_usd: float | None
    finished_at: float
    # A command child: its argv, exit code and the last lines of its output.
    command: tuple[str, ...] | None = None
    exit_code: int | None = None
    output: tuple[str, ...] = ()


@dataclass(frozen=True)
class PendingCallback:
    parent_session_id: str
    child: ChildResult


@dataclass(frozen=True)
class ParentState:
    session_id: str
    exists: bool
    busy: bool  # a run of the session has not finished: deliver after it
    # It and its descendants have spent its budget: it may not run again.
    over_budget: bool = False


@dataclass(frozen=True)
class Delivery:
    """One resume of ``parent_session_id`` carrying ``children``' results."""

    parent_session_id: str
    children: tuple[ChildResult, ...]

    @property
    def prompt(self) -> str:
        return callback_prompt(self.children)


@dataclass(frozen=True)
class Dropped:
    child_run_id: str
    parent_session_id: str
    code: str


def plan_deliveries(
    pending: Iterable[PendingCallback], parents: Mapping[str, ParentState], limits: Limits
) -> tuple[list[Delivery], list[Dropped]]:
    """The resumes to start now (one per idle parent, its children in the order they
    ended, at most ``max_batch``) and the callbacks to drop. A busy parent's callbacks
    wait: they come back with its next plan."""
    by_parent: dict[str, list[ChildResult]] = {}
    for callback in pending:
        by_parent.setdefault(callback.parent_session_id, []).append(callback.child)
    deliveries: list[Delivery] = []
    dropped: list[Dropped] = []
    for parent_id in sorted(by_parent):
        children = sorted(by_parent[parent_id], key=lambda c: (c.finished_at, c.run_id))
        state = parents.get(parent_id)
        if state is None or not state.exists:
            dropped += [Dropped(c.run_id, parent_id, "parent_gone") for c in children]
        elif state.busy:
            continue
        elif state.over_budget:
            dropped += [Dropped(c.run_id, parent_id, "budget_exceeded") for c in children]
        else:
            deliveries.append(Delivery(parent_id, tuple(children[: limits.max_batch])))
    return deliveries, dropped


def callback_prompt(children: Iterable[ChildResult]) -> str:
    """The message a parent is resumed with: each child's name, how it ended, its result
    (a command's: its exit code and the last lines of its output)."""
    children = list(children)
    commands = any(c.command is not None for c in children)
    parts = [f"Sub-agent sessions{' and commands' if commands else ''} you started have ended:"]
    for child in children:
        parts.append(_command_part(child) if child.command is not None else _session_part(child))
    return "\n\n".join(parts)


def _session_part(child: ChildResult) -> str:
    name = child.session_name or child.session_id or child.run_id
    cost = f", ${child.cost_usd:.4f}" if child.cost_usd is not None else ""
    heading = f"## {name} ({child.status}{cost}; run {child.run_id})"
    body = child.result if child.result is not None else f"(no result: {child.error or '?'})"
    return f"{heading}\n{body}"


def _command_part(child: ChildResult) -> str:
    assert child.command is not None
    code = f", exit code {child.exit_code}" if child.exit_code is not None else ""
    heading = f"## command `{shlex.join(child.command)}` ({child.status}{code}; run {child.run_id})"
    if child.output:
        return f"{heading}\n" + "\n".join(child.output)
    return f"{heading}\n(no output{f': {child.error}' if child.error else ''})"
