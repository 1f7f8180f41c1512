"""What an agent token may do: start and cancel runs as its own session's children.

A runner asks for a token minted for one attempt of an agent's run
(``POST /runner/runs/{id}/agent-token``) and gives it to that agent's MCP server. The token
lives while the attempt holds the run (``TokenStore.find``), and what it does is confined
to the run's session:

- every run it creates is a child of that session: ``parent_session`` is set to it, and
  naming another is refused (403 ``not_your_session``), so the depth, fan-out and budget
  limits hold for whatever the agent starts;
- a resume must name one of that session's children, and a cancel one of their runs;
- until the agent has announced its session it may start nothing (409
  ``session_not_ready``).

Reading is a client's (``Access.READ``); the rest of writing (tasks, actors …) is refused
by its role.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.coordinator.schemas import CreateRun
from corral.errors import Forbidden, SessionNotReady
from corral.store import Store


def confine(store: Store, run_id: str, bodies: Sequence[CreateRun]) -> list[CreateRun]:
    """The runs an agent asks for, as children of its own session (refused otherwise)."""
    mine = _own_session(store, run_id)
    confined = []
    for body in bodies:
        if body.parent_session is not None and body.parent_session not in mine:
            raise Forbidden(
                f"an agent's runs are children of its own session ({mine[0]}), not of "
                f"{body.parent_session!r}",
                code="not_your_session",
            )
        if body.type == "resume_session":
            key = body.session_id or body.session_name
            target = store.sessions.get(key).id if key else None
            if target is None or not store.callbacks.is_child(target, mine[0]):
                raise Forbidden(
                    f"session {key!r} is not a child of this agent's session {mine[0]}",
                    code="not_your_session",
                )
        confined.append(body.model_copy(update={"parent_session": mine[0]}))
    return confined


def check_cancel(store: Store, run_id: str, target_run_id: str) -> None:
    """An agent cancels only runs of its own session's children."""
    mine = _own_session(store, run_id)
    if store.runs.get(target_run_id).parent_session_id != mine[0]:
        raise Forbidden(
            f"run {target_run_id} is not a child of this agent's session {mine[0]}",
            code="not_your_session",
        )


def _own_session(store: Store, run_id: str) -> tuple[str, ...]:
    """The agent's session: its id, then its name (a parent may be named by either)."""
    run = store.runs.get(run_id)
    if run.session_id is None:
        raise SessionNotReady(f"run {run_id} has not announced its session yet")
    return (run.session_id,) + ((run.session_name,) if run.session_name else ())
