"""``corral mcp`` end to end: the official SDK's own client (``ClientSession``) over stdio
and over streamable HTTP, against a real coordinator and runner with the fake Claude CLI.

Every tool is called as an agent would; bad input (a missing or wrong-typed argument, an
unknown agent or session, a name in use) answers a tool error carrying the API's stable
code, and stores nothing."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import quote

import anyio
import httpx2
import pytest
from e2e_support import CORRAL, TOKEN, Cluster, Proc, free_port, wait_until
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

TOOLS = {
    "start_agent_session",
    "resume_agent_session",
    "get_agent_session_status",
    "get_agent_session_result",
    "list_agent_sessions",
    "list_agents",
    "cancel_run",
    "run_command",
    "add_tasks",
    "plan_status",
    "list_actors",
}
Scenario = Callable[[ClientSession], Awaitable[None]]


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.asynccontextmanager
async def _stdio(cluster: Cluster, *extra: str) -> AsyncIterator[ClientSession]:
    """``corral mcp`` as Claude Code starts it: a child process speaking on stdio."""
    params = StdioServerParameters(
        command=CORRAL,
        args=["mcp", "--url", cluster.url, *extra],
        env=cluster.env,  # CORRAL_TOKEN: the token the server sends
        cwd=str(cluster.root),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def _start_http(cluster: Cluster, *extra: str) -> int:
    port = free_port()
    env = {k: v for k, v in cluster.env.items() if k != "CORRAL_TOKEN"}  # callers bring theirs
    argv = [CORRAL, "mcp", "--http", "--port", str(port), "--url", cluster.url, *extra]
    server = Proc("mcp-http", argv, env, cluster.root)
    cluster.procs.append(server)
    server.start()
    wait_until(lambda: _port_open(port) or not server.alive(), 30, what="corral mcp --http")
    assert server.alive(), server.log()
    return port


@contextlib.asynccontextmanager
async def _http(port: int, token: str | None = TOKEN) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0, read=300.0)) as http,
        streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def _over(cluster: Cluster, transport: str, scenario: Scenario, *extra: str) -> None:
    port = _start_http(cluster, *extra) if transport == "http" else 0

    async def main() -> None:
        connect = _http(port) if transport == "http" else _stdio(cluster, *extra)
        async with connect as session:
            await scenario(session)

    anyio.run(main)


async def _ok(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, _text(result)
    assert result.structured_content is not None
    return result.structured_content


async def _refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    """The stable code of a refused call, after checking that it is a tool error."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result
    assert result.structured_content is not None, _text(result)
    error = result.structured_content["error"]
    assert _text(result) == f"{error['code']}: {error['message']}"
    code: str = error["code"]
    return code


def _text(result: CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_every_tool_against_a_real_coordinator(cluster: Cluster, transport: str) -> None:
    cluster.start_coordinator()
    cluster.start_runner("runner-a", slots=2)
    repo = cluster.root / "repo"
    repo.mkdir()

    async def scenario(session: ClientSession) -> None:
        assert {t.name for t in (await session.list_tools()).tools} == TOOLS
        assert await _ok(session, "list_actors") == {"actors": [], "next": None}
        agents = await _ok(session, "list_agents")
        assert [a["name"] for a in agents["agents"]] == ["claude"]

        done = await _ok(session, "start_agent_session", session_name="lead", prompt="plan it")
        assert (done["status"], done["result"]) == ("completed", "turn 1: plan it")
        again = await _ok(session, "resume_agent_session", session_name="lead", prompt="more")
        assert (again["result"], again["session_id"]) == ("turn 2: more", done["session_id"])

        started = await _ok(
            session,
            "start_agent_session",
            session_name="child-1",
            prompt="look [fake:sleep=1]",
            execution_mode="async_poll",
        )
        assert started["status"] == "pending" and started["result"] is None
        status = await _ok(
            session, "get_agent_session_status", session_name="child-1", wait_seconds=60
        )
        assert (status["status"], status["run_id"]) == ("finished", started["run_id"])
        result = await _ok(session, "get_agent_session_result", session_name="child-1")
        assert (result["result"], result["is_error"]) == ("turn 1: look [fake:sleep=1]", False)
        missing = await _ok(session, "get_agent_session_status", session_name="nobody")
        assert missing["status"] == "not_existent"
        listed = await _ok(session, "list_agent_sessions")
        assert {s["session_name"] for s in listed["sessions"]} == {"lead", "child-1"}

        echoed = await _ok(session, "run_command", command=["sh", "-c", "echo hi; exit 3"])
        assert (echoed["status"], echoed["exit_code"], echoed["output"]) == ("failed", 3, ["hi"])
        queued = await _ok(
            session, "run_command", command=["sleep", "60"], execution_mode="async_poll"
        )
        cancelled = await _ok(session, "cancel_run", run_id=queued["run_id"])
        assert cancelled["run_id"] == queued["run_id"]
        assert cancelled["status"] == "cancelled" or cancelled["cancel_requested"]

        tasks = [
            {"id": "schema", "title": "Schema"},
            {"id": "api", "title": "API", "after": ["schema"]},
        ]
        added = await _ok(
            session, "add_tasks", repo_path=str(repo), target_branch="main", tasks=tasks
        )
        assert sorted(added["created"]) == ["api", "schema"]
        plan = await _ok(session, "plan_status", repo_path=str(repo), target_branch="main")
        assert {t["id"]: t["status"] for t in plan["tasks"]} == {
            "schema": "ready",
            "api": "blocked",
        }

    _over(cluster, transport, scenario)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_bad_input_is_a_tool_error_with_its_code_and_stores_nothing(
    cluster: Cluster, transport: str
) -> None:
    cluster.start_coordinator()
    cluster.start_runner("runner-a")
    lead = cluster.client.create_run(type="start_session", prompt="hi", session_name="lead")
    cluster.wait_run(lead["run_id"])
    before = (cluster.client.list_runs(limit=500), cluster.client.call("GET", "/sessions"))

    async def scenario(session: ClientSession) -> None:
        refusals = {
            "missing prompt": await _refused(session, "start_agent_session", session_name="x"),
            "wrong type": await _refused(
                session, "get_agent_session_status", session_name="lead", wait_seconds="soon"
            ),
            "bad name": await _refused(
                session, "start_agent_session", session_name="a b", prompt="hi"
            ),
            "empty command": await _refused(session, "run_command", command=[]),
            "unknown agent": await _refused(
                session, "start_agent_session", session_name="x", prompt="hi", agent_name="nope"
            ),
            "unknown session": await _refused(
                session, "resume_agent_session", session_name="nobody", prompt="hi"
            ),
            "no result": await _refused(session, "get_agent_session_result", session_name="nobody"),
            "name in use": await _refused(
                session, "start_agent_session", session_name="lead", prompt="hi"
            ),
            "unknown run": await _refused(session, "cancel_run", run_id="run_000000000000"),
            "unknown state": await _refused(session, "list_actors", state="dancing"),
            "no plan": await _refused(
                session, "plan_status", repo_path="/nowhere", target_branch="main"
            ),
            # Sub-agent arguments of resume_agent_session and run_command.
            "resume, unknown mode": await _refused(
                session,
                "resume_agent_session",
                session_name="lead",
                prompt="hi",
                execution_mode="later",
            ),
            "resume, callback to nobody": await _refused(
                session,
                "resume_agent_session",
                session_name="lead",
                prompt="hi",
                execution_mode="async_callback",
            ),
            "resume, unknown parent": await _refused(
                session,
                "resume_agent_session",
                session_name="lead",
                prompt="hi",
                parent_session="nobody",
            ),
            "command, parent not a string": await _refused(
                session, "run_command", command=["true"], parent_session=5
            ),
            "command, callback to nobody": await _refused(
                session, "run_command", command=["true"], execution_mode="async_callback"
            ),
            "command, unknown parent": await _refused(
                session,
                "run_command",
                command=["true"],
                parent_session="nobody",
                execution_mode="async_callback",
            ),
        }
        assert refusals == {
            "missing prompt": "invalid_request",
            "wrong type": "invalid_request",
            "bad name": "invalid_request",
            "empty command": "invalid_request",
            "unknown agent": "unknown_agent",
            "unknown session": "session_not_found",
            "no result": "session_not_found",
            "name in use": "session_exists",
            "unknown run": "run_not_found",
            "unknown state": "invalid_request",
            "no plan": "project_not_found",
            "resume, unknown mode": "invalid_request",
            "resume, callback to nobody": "invalid_request",
            "resume, unknown parent": "parent_not_found",
            "command, parent not a string": "invalid_request",
            "command, callback to nobody": "invalid_request",
            "command, unknown parent": "parent_not_found",
        }

    _over(cluster, transport, scenario)
    after = (cluster.client.list_runs(limit=500), cluster.client.call("GET", "/sessions"))
    assert json.dumps(after, sort_keys=True) == json.dumps(before, sort_keys=True)


def test_http_without_a_token_is_refused_by_the_coordinator(cluster: Cluster) -> None:
    cluster.start_coordinator()
    port = _start_http(cluster)

    async def main() -> None:
        async with _http(port, token=None) as session:
            assert await _refused(session, "list_agents") == "unauthorized"

    anyio.run(main)


def test_an_agent_starts_a_sub_agent_through_the_mcp_server_its_runner_gives_it(
    cluster: Cluster,
) -> None:
    """--agent-mcp: each agent's MCP server sends a token minted for the agent's own run
    (what it may do with it: test_agent_tokens.py). The shared --agent-token is used by
    test_async_callback_children_resume_their_parent_once_with_both_results."""
    cluster.start_coordinator()
    # Two slots: the parent holds one while its sync sub-agent runs in the other.
    cluster.start_runner("runner-a", slots=2, extra=["--agent-mcp"])
    parent = cluster.client.create_run(
        type="start_session", session_name="lead", prompt="plan [fake:subagent=helper:look]"
    )
    run = cluster.wait_run(parent["run_id"], timeout=60)
    assert run["status"] == "completed", run
    assert run["result"] == "turn 1: plan [fake:subagent=helper:look] | helper: turn 1: look"
    child = cluster.client.session_result("helper")
    assert child["result"] == "turn 1: look"
    (helper,) = cluster.client.list_runs(session="helper")["runs"]
    assert helper["parent_session_id"] == run["session_id"]
    minted = {t.name for t in cluster.client.typed.list_tokens() if t.role == "agent"}
    assert minted == {f"agent of {run['run_id']}", f"agent of {helper['run_id']}"}


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_sync_call_reports_progress_while_its_run_goes_on(
    cluster: Cluster, transport: str
) -> None:
    cluster.start_coordinator()
    cluster.start_runner("runner-a")
    said: list[str | None] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        said.append(message)

    async def scenario(session: ClientSession) -> None:
        answer = await session.call_tool(
            "start_agent_session",
            {"session_name": "slow", "prompt": "think [fake:sleep=3]"},
            progress_callback=progress,
        )
        assert not answer.is_error, _text(answer)
        assert answer.structured_content is not None
        run_id = answer.structured_content["run_id"]
        assert answer.structured_content["result"] == "turn 1: think [fake:sleep=3]"
        assert said and set(said) == {f"run {run_id} has not ended yet"}

    _over(cluster, transport, scenario, "--progress-every", "0.5")


@pytest.mark.parametrize("kill", ["nothing", "coordinator", "runner"])
def test_async_callback_children_resume_their_parent_once_with_both_results(
    cluster: Cluster, kill: str
) -> None:
    """A parent agent starts two async_callback sub-agents through its MCP server. Both
    end while the parent is busy (a resume of it holds); the parent is then resumed once,
    with both results — also when the coordinator, or the runner holding the parent's
    session, is killed -9 after the children ended and before the parent's resume exists."""
    cluster.start_coordinator()
    agents = cluster.client.typed.create_token("client", name="agents").token
    runner = cluster.start_runner("runner-a", slots=3, extra=["--agent-token", agents])
    children_hold = cluster.root / "children-hold"
    parent_hold = cluster.root / "parent-hold"
    children_hold.touch()
    parent_hold.touch()
    prompt = "plan" + "".join(
        f" [fake:subagent_async={kid}:{word} {{fake:wait_while={children_hold}}}]"
        for kid, word in (("kid-a", "alpha"), ("kid-b", "beta"))
    )
    lead = cluster.client.create_run(type="start_session", session_name="lead", prompt=prompt)
    ended = cluster.wait_run(lead["run_id"], timeout=120)
    assert ended["result"] == f"turn 1: {prompt} | kid-a: pending | kid-b: pending", ended
    kids = {kid: cluster.client.list_runs(session=kid)["runs"][0] for kid in ("kid-a", "kid-b")}
    assert {k["parent_session_id"] for k in kids.values()} == {ended["session_id"]}

    busy = cluster.client.create_run(
        type="resume_session", session_id="lead", prompt=f"wait [fake:wait_while={parent_hold}]"
    )
    wait_until(lambda: cluster.client.get_run(busy["run_id"])["status"] == "running", 60)
    children_hold.unlink()
    for kid in kids.values():
        assert cluster.wait_run(kid["run_id"], timeout=60)["status"] == "completed"

    def callbacks() -> list[dict[str, Any]]:
        runs = cluster.client.list_runs(session="lead")["runs"]
        return [r for r in runs if (r["prompt"] or "").startswith("Sub-agent sessions")]

    assert callbacks() == []  # held: the parent is busy
    # SIGKILL: the callbacks are stored, the parent's resume is not.
    if kill == "coordinator":
        assert cluster.coordinator is not None
        cluster.coordinator.kill()
    elif kill == "runner":
        runner.send(signal.SIGKILL)
        assert runner.wait(10) == -signal.SIGKILL
    parent_hold.unlink()
    if kill == "coordinator":
        cluster.restart_coordinator()
    elif kill == "runner":  # the busy resume is lost, then runs again on runner-a
        cluster.start_runner("runner-a", slots=3, extra=["--agent-token", agents])
    assert cluster.wait_run(busy["run_id"], timeout=60)["status"] == "completed"
    resume = wait_until(lambda: callbacks() or None, 60)
    assert len(resume) == 1
    assert cluster.wait_run(resume[0]["run_id"], timeout=60)["status"] == "completed"
    prompt_back = resume[0]["prompt"]
    assert "turn 1: alpha [fake:wait_while=" in prompt_back
    assert "turn 1: beta [fake:wait_while=" in prompt_back
    assert len(callbacks()) == 1  # after it ran, still one: nothing was delivered twice


def test_a_resumed_session_and_a_command_call_their_parent_back(cluster: Cluster) -> None:
    """resume_agent_session and run_command with async_callback answer at once; when each
    ends, the parent session is resumed with its result (the command's: its exit code and
    output) — each child's delivered once."""
    cluster.start_coordinator()
    cluster.start_runner("runner-a", slots=2)
    children: list[str] = []

    async def scenario(session: ClientSession) -> None:
        await _ok(session, "start_agent_session", session_name="lead", prompt="plan")
        kid = await _ok(
            session,
            "start_agent_session",
            session_name="kid",
            prompt="look",
            parent_session="lead",
        )
        assert kid["result"] == "turn 1: look"  # sync: a child that called back nobody
        again = await _ok(
            session,
            "resume_agent_session",
            session_name="kid",
            prompt="again",
            execution_mode="async_callback",
            parent_session="lead",
        )
        command = await _ok(
            session,
            "run_command",
            command=["sh", "-c", "echo out; exit 3"],
            execution_mode="async_callback",
            parent_session="lead",
        )
        assert (again["status"], command["status"]) == ("pending", "pending")
        children.extend([again["run_id"], command["run_id"]])

    _over(cluster, "stdio", scenario)
    lead_id = cluster.client.list_runs(session="lead")["runs"][0]["session_id"]

    def delivered() -> bool:
        runs = [cluster.client.get_run(c) for c in children]
        return all(r["callback_state"] == "delivered" for r in runs)

    wait_until(delivered, 60, what="both callbacks delivered")
    assert {cluster.client.get_run(c)["parent_session_id"] for c in children} == {lead_id}
    resumes = {
        r["run_id"]: r["prompt"]
        for r in cluster.client.list_runs(session="lead")["runs"]
        if r["type"] == "resume_session"
    }
    assert {cluster.client.get_run(c)["callback_run_id"] for c in children} <= set(resumes)
    told = "\n".join(resumes.values())
    assert told.count("turn 2: again") == 1
    assert told.count("(failed, exit code 3; run ") == 1 and "\nout" in told


@pytest.mark.postgres
def test_the_tools_go_on_when_the_coordinator_they_used_dies(
    cluster: Cluster, pg_url: str, pg_schema: str
) -> None:
    """``corral mcp --url A,B`` (as a runner with both starts it for its agents): A killed
    mid-session, the next call goes to B — the run made through A is there."""
    sep = "&" if "?" in pg_url else "?"
    db = f"{pg_url}{sep}options={quote(f'-csearch_path={pg_schema}')}"
    a, b = cluster.start_coordinator(db=db), cluster.start_coordinator(db=db)

    async def main() -> None:
        async with _stdio(cluster, "--url", f"{a.url},{b.url}") as session:
            made = await _ok(session, "run_command", command=["true"], execution_mode="async_poll")
            a.kill()
            cancelled = await _ok(session, "cancel_run", run_id=made["run_id"])
            assert cancelled["status"] == "cancelled"

    anyio.run(main)
