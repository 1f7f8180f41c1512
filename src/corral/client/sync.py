"""``corral.Client``: the coordinator's REST API from blocking Python code."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import httpx
from httpx_sse import connect_sse

from corral.client import calls
from corral.client.calls import DEFAULT_URL, Call
from corral.client.coordinators import Coordinators, Following, Sending
from corral.client.models import (
    Actor,
    ActorPage,
    Agent,
    AgentProfiles,
    CreatedToken,
    LogLine,
    LogPage,
    NewTask,
    PlanStatus,
    Project,
    Run,
    RunCreated,
    Runner,
    RunPage,
    Session,
    SessionResult,
    Stats,
    Task,
    TasksAdded,
    Token,
)
from corral.credentials import auth_headers, read_token
from corral.tokens import Role

T = TypeVar("T")


class Client:
    """A client of a coordinator. Every method sends one request (``wait_run`` and
    ``follow_logs`` hold one open) and returns typed models; a refusal raises the API's
    error as a ``corral.errors.CorralError`` whose ``.code`` is the stable code
    (``session_not_found``, ``unknown_agent``, …); an unreachable coordinator raises
    ``Unavailable``.

    >>> from corral import Client
    >>> with Client("http://127.0.0.1:8765") as corral:          # doctest: +SKIP
    ...     created = corral.run_command(["sh", "-c", "echo hi"])
    ...     run = corral.wait_run(created.run_id)
    ...     print(run.status, [line.text for line in corral.logs(run.run_id).lines])
    completed ['hi']

    ``url``: one coordinator's URL, or several (a list, or commas) of coordinators on one
    database: a request that cannot reach one goes to the next when that is safe (see
    ``corral.client.coordinators``).
    ``token``: the bearer token; left out, the one in ``.corral/credentials`` of the
    current directory (where a local coordinator writes its own); ``""``: none.
    ``transport``: an ``httpx`` transport (tests).
    """

    def __init__(
        self,
        url: str | Sequence[str] | Coordinators = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.coordinators = url if isinstance(url, Coordinators) else Coordinators(url)
        self._http = httpx.Client(
            headers=auth_headers(read_token() if token is None else token),
            timeout=timeout_s,
            transport=transport,
        )

    @property
    def url(self) -> str:
        """The coordinator talked to now (of several: the one that last answered)."""
        return self.coordinators.current

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: Call[T]) -> T:
        sending = Sending(self.coordinators, call)
        for url in sending.urls:
            try:
                response = self._http.request(**sending.request(url))
            except httpx.TransportError as exc:
                sending.failed(url, exc)  # raises unless it may go to the next
                continue
            if sending.answered(url, response):
                return call.parse(sending.body)
        raise sending.none_answered()

    def request(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None
    ) -> Any:
        """Any endpoint, for what has no method here: the decoded JSON answer."""
        return self._send(calls.raw(method, path, params, json))

    # ---- runs --------------------------------------------------------------------------------

    def create_run(
        self, type: str, *, idempotency_key: str | None = None, **fields: Any
    ) -> RunCreated:
        """Queue a run of ``type`` (``start_session``, ``resume_session`` or ``command``);
        answers at once. ``fields``: those of ``POST /runs`` (``prompt``, ``labels``, …).

        ``idempotency_key``: this request's (by default one made for this call): a call
        again with the key, after an error that left its outcome unknown, gets the run
        the first created, or creates it; never a second."""
        spec = calls.run_spec(type, **fields)
        return self._send(calls.create_run(spec, idempotency_key))

    def start_session(self, prompt: str, **fields: Any) -> RunCreated:
        """Start an agent session; ``session_name``, ``agent_name``, ``project_dir`` …

        >>> corral.start_session("Summarise README.md", session_name="demo")  # doctest: +SKIP
        RunCreated(run_id='run_…', status=<RunStatus.PENDING: 'pending'>)
        """
        return self.create_run("start_session", prompt=prompt, **fields)

    def resume_session(self, session: str, prompt: str, **fields: Any) -> RunCreated:
        """Continue ``session`` (its id or name) on the runner and directory that hold it."""
        return self.create_run("resume_session", session_id=session, prompt=prompt, **fields)

    def run_command(self, command: Sequence[str], **fields: Any) -> RunCreated:
        """Run a command (an argv) on a runner; ``labels``, ``timeout_s``, ``env`` …"""
        return self.create_run("command", command=command, **fields)

    def create_runs(
        self, specs: Sequence[dict[str, Any]], *, idempotency_key: str | None = None
    ) -> list[RunCreated]:
        """Queue many runs in one transaction: all are created, or none
        (``idempotency_key``: as ``create_run``'s)."""
        return self._send(calls.create_runs(specs, idempotency_key))

    def get_run(self, run_id: str) -> Run:
        return self._send(calls.get_run(run_id))

    def list_runs(
        self,
        *,
        status: str | Iterable[str] | None = None,
        session: str | None = None,
        runner_id: str | None = None,
        before: str | None = None,
        limit: int = 50,
    ) -> RunPage:
        """Newest first; pass ``page.next`` as ``before`` for the next page."""
        return self._send(
            calls.list_runs(
                status=status, session=session, runner_id=runner_id, before=before, limit=limit
            )
        )

    def cancel_run(self, run_id: str) -> Run:
        """Cancel a pending run at once, or ask its runner to stop it."""
        return self._send(calls.cancel_run(run_id))

    def logs(self, run_id: str, after: int = 0, limit: int = 1000) -> LogPage:
        """Output lines after the line id ``after``; ``page.next_after`` reads on."""
        return self._send(calls.logs(run_id, after, limit))

    def follow_logs(self, run_id: str, after: int = 0) -> Iterator[LogLine | Run]:
        """Each output line as it is written, then the finished ``Run``. A stream the
        coordinator closed early (it is shutting down) ends without the ``Run`` — with
        several coordinators it goes on at the next one, after the last line passed on."""
        following = Following(self.coordinators)
        while True:
            url = self.coordinators.current
            try:
                with self._http.stream(
                    "GET",
                    url + calls.logs_path(run_id),
                    params=calls.follow_params(after),
                    timeout=None,
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        calls.decode(response)
                    following.opened(url)
                    for line in response.iter_lines():
                        if not line:
                            continue
                        item = calls.log_event(json.loads(line))
                        following.passed()
                        if isinstance(item, Run):
                            yield item
                            return
                        after = item.id
                        yield item
            except httpx.TransportError as exc:
                lost = following.lost(url, exc)
                if lost is not None:
                    raise lost from exc
                continue
            if not following.ended_early(url):
                return

    def wait_run(self, run_id: str) -> Run:
        """Block until the run has ended; returns it (however it ended)."""
        while True:
            for item in self.follow_logs(run_id, calls.SKIP_ALL_LINES):
                if isinstance(item, Run):
                    return item
            run = self.get_run(run_id)  # the stream was cut short: it may have ended
            if run.finished:
                return run

    def events(self, after: int | None = None, **filters: str | None) -> Iterator[dict[str, Any]]:
        """``GET /events`` (see ``corral.events``): each message as ``{"event": name, "id":
        …, "data": {…}}`` — ``ready`` first, the stored events, ``caught_up``, then events
        as they commit (``event`` is their kind), perhaps ``dropped`` last; ``keepalive``
        (``data`` None) when the stream is quiet, every 15 s. ``filters``:
        ``kind``, ``run_id``, ``session``, ``plan``, ``runner``. Ends when the coordinator
        closes the stream; raises ``Unavailable`` when it goes away. With several
        coordinators, a stream cut or closed (unless ``dropped``) goes on at the next one
        after the last id passed on, opening with ``ready`` again."""
        params = {k: v for k, v in filters.items() if v is not None}
        following = Following(self.coordinators)
        while True:
            if after is not None:
                params["after"] = str(after)
            url = self.coordinators.current
            last = None
            try:
                with connect_sse(
                    self._http, "GET", url + "/events", params=params, timeout=None
                ) as source:
                    if source.response.status_code >= 400:
                        source.response.read()
                        calls.decode(source.response)
                    following.opened(url)
                    for message in source.iter_sse():
                        following.passed()
                        if not message.data:  # a comment: the stream's keepalive
                            yield {"event": "keepalive", "id": None, "data": None}
                            continue
                        event_id = int(message.id) if message.id else None
                        after = event_id if event_id is not None else after
                        last = message.event
                        yield {"event": message.event, "id": event_id, "data": message.json()}
            except httpx.TransportError as exc:
                lost = following.lost(url, exc)
                if lost is not None:
                    raise lost from exc
                continue
            # ``dropped``: the caller fell behind, and is told so; else the coordinator
            # is stopping.
            if last == "dropped" or not following.ended_early(url):
                return

    # ---- sessions, runners, agents -------------------------------------------------------------

    def list_sessions(self, limit: int = 50) -> list[Session]:
        """The most recently updated sessions first."""
        return self._send(calls.list_sessions(limit))

    def get_session(self, session: str) -> Session:
        """A session by id or name (the most recent with that name)."""
        return self._send(calls.get_session(session))

    def session_result(self, session: str) -> SessionResult:
        """The session's latest finished result."""
        return self._send(calls.session_result(session))

    def list_runners(self) -> list[Runner]:
        return self._send(calls.list_runners())

    def drain_runner(self, runner_id: str, grace_s: float | None = None) -> Runner:
        return self._send(calls.drain_runner(runner_id, grace_s))

    def stop_runner(self, runner_id: str) -> Runner:
        return self._send(calls.stop_runner(runner_id))

    def agent_profiles(self) -> AgentProfiles:
        """The agent profiles loaded and the ``corral.toml`` they came from."""
        return self._send(calls.list_agents())

    def list_agents(self) -> list[Agent]:
        return self.agent_profiles().agents

    def stats(self) -> Stats:
        return self._send(calls.stats())

    # ---- task graphs ---------------------------------------------------------------------------

    def ensure_project(self, repo_path: str, target_branch: str, **settings: Any) -> Project:
        """The project of a repository and branch, created on first use."""
        return self._send(calls.ensure_project(repo_path, target_branch, settings))

    def list_projects(self) -> list[Project]:
        return self._send(calls.list_projects())

    def get_project(self, project_id: str) -> Project:
        return self._send(calls.get_project(project_id))

    def add_tasks(
        self,
        project_id: str,
        tasks: Sequence[NewTask | dict[str, Any]],
        *,
        digest: str | None = None,
    ) -> TasksAdded:
        """Add tasks to a plan (importing the same tasks again changes nothing).

        >>> corral.add_tasks(pid, [NewTask(id="a", title="A")])  # doctest: +SKIP
        TasksAdded(created=['a'], updated=[], unchanged=[])
        """
        return self._send(calls.add_tasks(project_id, tasks, digest))

    def plan_status(self, project_id: str) -> PlanStatus:
        """The project (with counts per status) and every task."""
        return self._send(calls.plan_status(project_id))

    def get_task(self, project_id: str, key: str) -> Task:
        return self._send(calls.get_task(project_id, key))

    def start_plan(self, project_id: str, workers: int) -> list[str]:
        """Work through the plan with up to ``workers`` tasks at once; the tasks scheduled."""
        return self._send(calls.start_plan(project_id, workers))

    def stop_plan(self, project_id: str) -> Project:
        return self._send(calls.stop_plan(project_id))

    def pause_plan(self, project_id: str) -> bool:
        return self._send(calls.pause_plan(project_id, True))

    def resume_plan(self, project_id: str) -> bool:
        return self._send(calls.pause_plan(project_id, False))

    def retry_task(self, project_id: str, key: str) -> Task:
        return self._send(calls.task_action(project_id, key, "retry"))

    def cancel_task(self, project_id: str, key: str) -> Task:
        return self._send(calls.task_action(project_id, key, "cancel"))

    # ---- actors --------------------------------------------------------------------------------

    def list_actors(
        self,
        *,
        name: str | None = None,
        key: str | None = None,
        pool: str | None = None,
        state: str | Iterable[str] | None = None,
        before: str | None = None,
        limit: int = 50,
    ) -> ActorPage:
        """Actors, newest first; pass ``page.next`` as ``before`` for the next page."""
        return self._send(
            calls.list_actors(
                name=name, key=key, pool=pool, state=state, before=before, limit=limit
            )
        )

    def get_actor(self, actor_id: str) -> Actor:
        return self._send(calls.get_actor(actor_id))

    # ---- tokens (admin) ------------------------------------------------------------------------

    def create_token(
        self, role: Role | str, *, name: str = "", labels: Sequence[str] | None = None
    ) -> CreatedToken:
        """A new token; its secret (``.token``) is in this answer only."""
        return self._send(calls.create_token(role, name, labels))

    def list_tokens(self) -> list[Token]:
        return self._send(calls.list_tokens())

    def revoke_token(self, token_id: str) -> Token:
        return self._send(calls.revoke_token(token_id))
