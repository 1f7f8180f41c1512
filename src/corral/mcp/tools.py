"""The MCP tools: agent sessions as the seed system names them, plus runs and plans.

Each tool is a few calls of ``corral.AsyncClient``; its arguments are typed (the SDK
publishes them as the tool's input schema and refuses what does not fit it) and so is its
answer (the output schema). A refusal of the coordinator is raised as the API's error; the
server turns it into a tool error carrying its stable code (``server.py``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import anyio
import httpx
from mcp.server.mcpserver import Context
from pydantic import BaseModel, Field

from corral.client import (
    ActorPage,
    Agent,
    AsyncClient,
    NewTask,
    PlanStatus,
    Run,
    RunCreated,
    Session,
    TasksAdded,
)
from corral.client.coordinators import Coordinators
from corral.errors import Conflict, InvalidRequest, NotFound

# The seed system's rule for session names (its MCP server refuses others).
SessionName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=60,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="the session's name: letters, digits, '-' and '_', at most 60",
    ),
]
Prompt = Annotated[str, Field(min_length=1, description="what the agent is asked to do")]
SubAgentMode = Annotated[
    Literal["sync", "async_poll", "async_callback"],
    Field(
        description="sync: wait for the agent's result; async_poll: answer at once with the "
        "run id (follow it with get_agent_session_status / get_agent_session_result); "
        "async_callback: answer at once, and when the sub-agent ends your session is "
        "resumed with its result (with every sub-agent's that ended meanwhile)"
    ),
]
ParentSession = Annotated[
    str | None,
    Field(
        description="the session (id or name) the new one is a sub-agent of; by default the "
        "session of the agent this server was started for (CORRAL_RUN_ID)"
    ),
]
CommandParentSession = Annotated[
    str | None,
    Field(
        description="the session (id or name) the command is run for: with async_callback "
        "it is resumed with the command's exit code and last lines of output; by default, "
        "for async_callback only, the session of the agent this server was started for"
    ),
]
# The agent announces its session as it starts; its first tool call may come sooner.
PARENT_SESSION_WAIT_S = 30.0
PROGRESS_EVERY_S = 10.0  # while a sync call waits for its run
OUTPUT_TAIL_LINES = 50  # of a command's output, in run_command's answer


class AgentRun(BaseModel):
    """A run of an agent session: its result once it has ended (``sync``)."""

    session_name: str
    run_id: str
    status: str = Field(description="the run's status: pending, running, completed, failed …")
    session_id: str | None = None
    result: str | None = None
    error: str | None = None
    cost_usd: float | None = None

    @classmethod
    def of(cls, name: str, run: Run) -> AgentRun:
        return cls(
            session_name=name,
            run_id=run.run_id,
            status=run.status,
            session_id=run.session_id,
            result=run.result,
            error=run.error,
            cost_usd=run.cost_usd,
        )


class SessionStatus(BaseModel):
    session_name: str
    status: Literal["running", "finished", "not_existent"]
    run_id: str | None = Field(default=None, description="the session's latest run")
    run_status: str | None = None


class SessionResult(BaseModel):
    session_name: str
    session_id: str
    result: str | None
    is_error: bool
    run_id: str | None
    cost_usd: float | None = Field(default=None, description="the whole session's cost so far")


class Sessions(BaseModel):
    sessions: list[Session]


class Agents(BaseModel):
    agents: list[Agent]


class CommandRun(BaseModel):
    run_id: str
    status: str
    exit_code: int | None = None
    error: str | None = None
    output: list[str] = Field(
        default_factory=list, description=f"the last {OUTPUT_TAIL_LINES} lines (sync only)"
    )


class Tools:
    """The tools of one server: each call opens a client of the coordinator at ``url`` (of
    several, comma-separated: the one that last answered, the next when it cannot).

    The token it sends is the one the MCP request carries (``Authorization`` of an HTTP
    request), else the server's own (``token``: stdio, where the server is the caller's
    own process)."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        forward_token: bool,
        progress_every_s: float = PROGRESS_EVERY_S,
        agent_run_id: str | None = None,
    ) -> None:
        self.url = url
        # One for every call's client: once one call moved to another coordinator, the
        # next ones start there.
        self.coordinators = Coordinators(url)
        # The run of the agent this server was started for (by its runner): its session
        # is the parent of the sessions it starts.
        self.agent_run_id = agent_run_id
        self.progress_every_s = progress_every_s
        self.token = token
        self.forward_token = forward_token
        # One connection pool for the server's life: a client of its own per call would
        # cost ~100 ms each (its TLS context), more than the call itself.
        self._transport: httpx.AsyncHTTPTransport | None = None

    def client(self, ctx: Context) -> AsyncClient:
        """A client for this call, sending its caller's token; cheap (the pool is shared),
        and never closed (closing it would close the shared pool)."""
        token = self.token
        if self.forward_token:
            given = (ctx.headers or {}).get("authorization", "")
            token = given.removeprefix("Bearer ").strip() or None
        if self._transport is None:
            self._transport = httpx.AsyncHTTPTransport()
        return AsyncClient(self.coordinators, token=token or "", transport=self._transport)

    # ---- agent sessions (the seed system's tools) ----------------------------------------------

    async def start_agent_session(
        self,
        ctx: Context,
        session_name: SessionName,
        prompt: Prompt,
        agent_name: str | None = None,
        project_dir: str | None = None,
        execution_mode: SubAgentMode = "sync",
        parent_session: ParentSession = None,
    ) -> AgentRun:
        corral = self.client(ctx)
        if (await corral.list_runs(session=session_name, limit=1)).runs:
            raise Conflict(
                f"session {session_name!r} exists: continue it with resume_agent_session",
                code="session_exists",
            )
        parent = await self._parent(corral, parent_session, execution_mode)
        created = await corral.start_session(
            prompt,
            session_name=session_name,
            agent_name=agent_name,
            project_dir=project_dir,
            parent_session=parent,
            callback=execution_mode if parent else None,
        )
        return await self._answer(ctx, corral, session_name, created, execution_mode)

    async def _parent(
        self, corral: AsyncClient, named: str | None, mode: str, *, default: bool = True
    ) -> str | None:
        """The parent session of a new run: the one ``named``, else (if ``default``) the
        calling agent's own; async_callback needs one (it is whom the callback resumes)."""
        parent = named or (await self._agent_session(corral) if default else None)
        if mode == "async_callback" and parent is None:
            raise InvalidRequest(
                "async_callback needs a parent session to resume: name it (parent_session)"
            )
        return parent

    async def _agent_session(self, corral: AsyncClient) -> str | None:
        """The session of the agent this server serves, once it has announced it."""
        if self.agent_run_id is None:
            return None
        with anyio.move_on_after(PARENT_SESSION_WAIT_S):
            while True:
                run = await corral.get_run(self.agent_run_id)
                if run.session_id or run.finished:
                    return run.session_id
                await anyio.sleep(0.2)
        return None

    async def resume_agent_session(
        self,
        ctx: Context,
        session_name: SessionName,
        prompt: Prompt,
        execution_mode: SubAgentMode = "sync",
        parent_session: ParentSession = None,
    ) -> AgentRun:
        corral = self.client(ctx)
        parent = await self._parent(corral, parent_session, execution_mode)
        created = await corral.resume_session(
            session_name,
            prompt,
            parent_session=parent,
            callback=execution_mode if parent else None,
        )
        return await self._answer(ctx, corral, session_name, created, execution_mode)

    async def get_agent_session_status(
        self,
        ctx: Context,
        session_name: SessionName,
        wait_seconds: Annotated[
            int, Field(ge=0, le=300, description="wait up to this long for it to finish")
        ] = 0,
    ) -> SessionStatus:
        corral = self.client(ctx)
        latest = (await corral.list_runs(session=session_name, limit=1)).runs
        if not latest:
            return SessionStatus(session_name=session_name, status="not_existent")
        run = latest[0]
        if not run.finished and wait_seconds:
            with anyio.move_on_after(wait_seconds):
                run = await corral.wait_run(run.run_id)
        return SessionStatus(
            session_name=session_name,
            status="finished" if run.finished else "running",
            run_id=run.run_id,
            run_status=run.status,
        )

    async def get_agent_session_result(
        self, ctx: Context, session_name: SessionName
    ) -> SessionResult:
        corral = self.client(ctx)
        latest = (await corral.list_runs(session=session_name, limit=1)).runs
        if not latest:
            raise NotFound.of("session", session_name)
        if not latest[0].finished:
            raise Conflict(
                f"session {session_name!r} is still running (run {latest[0].run_id}): "
                "wait with get_agent_session_status",
                code="session_running",
            )
        found = await corral.session_result(session_name)
        return SessionResult(
            session_name=session_name,
            session_id=found.session_id,
            result=found.result,
            is_error=found.is_error,
            run_id=found.last_run_id,
            cost_usd=found.cost_usd,
        )

    async def list_agent_sessions(
        self,
        ctx: Context,
        limit: Annotated[int, Field(ge=1, le=500)] = 50,
    ) -> Sessions:
        corral = self.client(ctx)
        return Sessions(sessions=await corral.list_sessions(limit))

    async def list_agents(self, ctx: Context) -> Agents:
        corral = self.client(ctx)
        return Agents(agents=await corral.list_agents())

    async def cancel_run(self, ctx: Context, run_id: Annotated[str, Field(min_length=1)]) -> Run:
        corral = self.client(ctx)
        return await corral.cancel_run(run_id)

    # ---- corral's own ---------------------------------------------------------------------------

    async def run_command(
        self,
        ctx: Context,
        command: Annotated[list[str], Field(min_length=1, description="the argv to run")],
        labels: Annotated[
            list[str], Field(description="only a runner with these labels runs it")
        ] = [],  # noqa: B006  (read only: the SDK needs a plain default for the schema)
        timeout_s: Annotated[float | None, Field(gt=0)] = None,
        execution_mode: SubAgentMode = "sync",
        parent_session: CommandParentSession = None,
    ) -> CommandRun:
        corral = self.client(ctx)
        # A command starts no session, so it need not count as the agent's child unless
        # its end is to resume the agent.
        default = execution_mode == "async_callback"
        parent = await self._parent(corral, parent_session, execution_mode, default=default)
        created = await corral.run_command(
            command,
            labels=labels,
            timeout_s=timeout_s,
            parent_session=parent,
            callback=execution_mode if parent else None,
        )
        if execution_mode != "sync":
            return CommandRun(run_id=created.run_id, status=created.status)
        run = await self._wait(ctx, corral, created.run_id)
        lines = await _tail(corral, run.run_id)
        return CommandRun(
            run_id=run.run_id,
            status=run.status,
            exit_code=run.exit_code,
            error=run.error,
            output=lines,
        )

    async def add_tasks(
        self,
        ctx: Context,
        repo_path: Annotated[str, Field(min_length=1, description="the git repository")],
        target_branch: Annotated[str, Field(description="the branch tasks are merged into")],
        tasks: Annotated[list[NewTask], Field(min_length=1)],
    ) -> TasksAdded:
        corral = self.client(ctx)
        project = await corral.ensure_project(repo_path, target_branch)
        return await corral.add_tasks(project.project_id, tasks)

    async def list_actors(
        self,
        ctx: Context,
        name: str | None = None,
        pool: str | None = None,
        state: Annotated[
            str | None, Field(description="comma-separated: pending, running, sleeping …")
        ] = None,
        limit: Annotated[int, Field(ge=1, le=500)] = 50,
    ) -> ActorPage:
        corral = self.client(ctx)
        return await corral.list_actors(name=name, pool=pool, state=state, limit=limit)

    async def _answer(
        self, ctx: Context, corral: AsyncClient, name: str, created: RunCreated, mode: str
    ) -> AgentRun:
        """``async_poll``, ``async_callback``: the run as created; ``sync``: as it ended."""
        if mode in ("async_poll", "async_callback"):
            return AgentRun(session_name=name, run_id=created.run_id, status=created.status)
        return AgentRun.of(name, await self._wait(ctx, corral, created.run_id))

    async def _wait(self, ctx: Context, corral: AsyncClient, run_id: str) -> Run:
        """The run once it has ended; meanwhile a progress notification every
        ``progress_every_s`` to a caller that asked for them (clients drop a call that
        stays silent too long). Each wait follows the run's log stream to its end."""
        beats = 0
        while True:
            with anyio.move_on_after(self.progress_every_s):
                return await corral.wait_run(run_id)
            beats += 1
            await ctx.report_progress(beats, message=f"run {run_id} has not ended yet")

    async def plan_status(
        self,
        ctx: Context,
        repo_path: Annotated[str, Field(min_length=1)],
        target_branch: str,
    ) -> PlanStatus:
        corral = self.client(ctx)
        for project in await corral.list_projects():
            if (project.repo_path, project.target_branch) == (repo_path, target_branch):
                return await corral.plan_status(project.project_id)
        raise NotFound(
            f"no plan for {repo_path} on {target_branch!r}: add tasks first",
            code="project_not_found",
        )


async def _tail(corral: AsyncClient, run_id: str) -> list[str]:
    lines: list[str] = []
    after = 0
    while page := (await corral.logs(run_id, after)).lines:
        lines = (lines + [line.text for line in page])[-OUTPUT_TAIL_LINES:]
        after = page[-1].id
    return lines
