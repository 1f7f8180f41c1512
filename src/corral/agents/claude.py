"""The Claude Code executor: ``claude -p`` in headless mode, read as stream-json.

The process prints one JSON object per line. Two of them matter here:

    {"type": "system", "subtype": "init", "session_id": ...}   the session exists
    {"type": "result", "subtype": "success", "is_error": ..., "result": ..., ...}

The result line is the verdict, not the exit code: Claude Code sometimes lingers or is
killed after printing it, and the work it reports is done all the same. A result that
says the usage or rate limit was hit gives the attempt back (``PENDING``) rather than
failing the run.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable
from typing import Any

from corral.agents.base import (
    Observation,
    OutputObserver,
    ProcessSpec,
    ResultSeen,
    SessionSeen,
    StopReason,
)
from corral.agents.outcome import stopped_report
from corral.assignment import Assignment
from corral.errors import InvalidRequest
from corral.runs import RunReport, RunStatus, RunType

# A nested Claude Code refuses to start when it sees these (its nested-session guard).
_STRIPPED_PREFIX = "CLAUDECODE"
_STRIPPED_NAMES = frozenset({"CLAUDE_CODE_ENTRYPOINT"})

# What Claude Code needs of the runner's environment: its credentials and provider settings
# (Anthropic API, Bedrock, Vertex), its config directory, a proxy.
HOST_ENV: tuple[str, ...] = (
    "ANTHROPIC_*",
    "CLAUDE_CONFIG_DIR",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "AWS_*",
    "CLOUD_ML_REGION",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "VERTEX_REGION_*",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
)

_RATE_LIMIT = re.compile(r"usage limit|rate limit|\b429\b|overloaded", re.IGNORECASE)
# "Claude AI usage limit reached|1700000000": the epoch second the limit resets.
_RESET_AT = re.compile(r"\|\s*(\d{9,13})\s*$")


@dataclasses.dataclass(frozen=True)
class AgentMcp:
    """corral's MCP server for an agent: how to start it (stdio) and the token it sends
    (None until the runner has one minted for the agent's run: no server without it)."""

    command: tuple[str, ...]
    token: str | None = dataclasses.field(repr=False)

    def config(self) -> str:
        """``--mcp-config``: the token is named, not written (``${CORRAL_TOKEN}``, from the
        agent's environment), so it never shows in a process list."""
        program, *args = self.command
        server = {
            "type": "stdio",
            "command": program,
            "args": args,
            # CORRAL_RUN_ID: the agent's run, whose session is its sub-agents' parent.
            "env": {"CORRAL_TOKEN": "${CORRAL_TOKEN}", "CORRAL_RUN_ID": "${CORRAL_RUN_ID}"},
        }
        return json.dumps({"mcpServers": {"corral": server}})


class ClaudeExecutor:
    host_env = HOST_ENV
    missing_program_hint = (
        "install Claude Code, or name its executable with --claude-bin (CORRAL_CLAUDE_BIN)"
    )

    def __init__(
        self,
        binary: str = "claude",
        result_grace_s: float = 5.0,
        rate_limit_backoff_s: float = 60.0,
        now: Callable[[], float] = time.time,
        mcp: AgentMcp | None = None,
    ) -> None:
        self.binary = binary
        self.mcp = mcp
        self.result_grace_s = result_grace_s
        self.rate_limit_backoff_s = rate_limit_backoff_s
        self.now = now

    def prepare(self, run: Assignment, base_env: dict[str, str]) -> ProcessSpec:
        if not run.prompt:
            raise InvalidRequest(f"run {run.id} has no prompt", run_id=run.id)
        argv = [self.binary, "-p"]
        # A prompt that starts with "-" would be read as a flag: end the options first.
        dashed = run.prompt.startswith("-")
        if not dashed:
            argv.append(run.prompt)
        argv += ["--output-format", "stream-json", "--verbose"]
        agent = run.agent
        if agent is not None:
            if agent.model:
                argv += ["--model", agent.model]
            if agent.allowed_tools:
                argv += ["--allowedTools", ",".join(agent.allowed_tools)]
            if agent.system_prompt:
                argv += ["--append-system-prompt", agent.system_prompt]
            if agent.max_turns is not None:
                argv += ["--max-turns", str(agent.max_turns)]
            argv += agent.extra_args
        mcp = self.mcp if self.mcp is not None and self.mcp.token else None
        if mcp is not None:
            argv += ["--mcp-config", mcp.config()]
        if run.type is RunType.RESUME_SESSION:
            if not run.session_id:
                raise InvalidRequest(f"run {run.id} resumes no session", run_id=run.id)
            argv += ["--resume", run.session_id]
        if dashed:
            argv += ["--", run.prompt]
        env = {
            name: value
            for name, value in {**base_env, **(agent.env if agent else {}), **run.env}.items()
            if not name.startswith(_STRIPPED_PREFIX) and name not in _STRIPPED_NAMES
        }
        if mcp is not None and mcp.token:
            env["CORRAL_TOKEN"] = mcp.token
            env["CORRAL_RUN_ID"] = run.id
        return ProcessSpec(
            argv=tuple(argv),
            cwd=run.project_dir,
            env=env,
            exit_grace_after_result_s=self.result_grace_s,
        )

    def observer(self, run: Assignment) -> OutputObserver:
        return StreamJsonObserver(
            rate_limit_backoff_s=self.rate_limit_backoff_s,
            now=self.now,
            session_id=run.session_id if run.type is RunType.RESUME_SESSION else None,
        )


class StreamJsonObserver:
    """Reads Claude Code's stream-json lines; the result line decides the outcome."""

    def __init__(
        self,
        rate_limit_backoff_s: float = 60.0,
        now: Callable[[], float] = time.time,
        session_id: str | None = None,
    ) -> None:
        self._backoff_s = rate_limit_backoff_s
        self._now = now
        # A resumed session keeps its id, so it is known before the init line says so.
        self._session_id = session_id
        self._announced = False
        self._result: dict[str, Any] | None = None

    def feed(self, line: str) -> list[Observation]:
        # stdout may carry anything (warnings, partial lines): never let it raise.
        try:
            message = json.loads(line)
        except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
            return []
        if not isinstance(message, dict):
            return []
        kind = message.get("type")
        session_id = message.get("session_id")
        if kind == "system" and message.get("subtype") == "init" and isinstance(session_id, str):
            self._session_id = session_id
            if not self._announced:
                self._announced = True
                return [SessionSeen(session_id)]
            return []
        if kind == "result":
            self._result = message
            if isinstance(session_id, str) and session_id:
                self._session_id = session_id
            return [ResultSeen()]
        return []

    def outcome(self, exit_code: int | None, stopped: StopReason | None) -> RunReport:
        if self._result is not None:
            # The result stands even when the process was killed afterwards.
            return self._judge(self._result, exit_code)
        if stopped is not None:
            return dataclasses.replace(
                stopped_report(stopped, exit_code), session_id=self._session_id
            )
        return RunReport(
            RunStatus.FAILED,
            exit_code=exit_code,
            error=f"claude exited with code {exit_code} before its result",
            session_id=self._session_id,
        )

    def _judge(self, result: dict[str, Any], exit_code: int | None) -> RunReport:
        text = result.get("result")
        text = text if isinstance(text, str) else None
        subtype = str(result.get("subtype") or "unknown")
        is_error = result.get("is_error") is True
        cost = result.get("total_cost_usd")
        usage = result.get("usage")
        turns = result.get("num_turns")
        report = RunReport(
            RunStatus.COMPLETED,
            exit_code=exit_code,
            result=text,
            session_id=self._session_id,
            cost_usd=_number(cost),
            usage=usage if isinstance(usage, dict) else None,
            num_turns=turns if isinstance(turns, int) and not isinstance(turns, bool) else None,
        )
        if _rate_limited(result, is_error, text):
            return dataclasses.replace(
                report,
                status=RunStatus.PENDING,
                error=f"rate limited: {text or subtype}",
                retry_after_s=self._retry_after(text),
            )
        if subtype != "success":
            # error_max_turns, error_during_execution, ...: some say is_error false.
            error = f"claude stopped with {subtype}" + (f": {text}" if text else "")
            return dataclasses.replace(report, status=RunStatus.FAILED, error=error)
        if is_error:
            # "success" with is_error true: an API or auth error reported as the result.
            return dataclasses.replace(report, status=RunStatus.FAILED, error=text or subtype)
        return report

    def _retry_after(self, text: str | None) -> float:
        match = _RESET_AT.search(text or "")
        if match is None:
            return self._backoff_s
        reset_at = int(match.group(1))
        if reset_at > 10**11:  # milliseconds rather than seconds
            reset_at //= 1000
        return max(1.0, reset_at - self._now())


def _rate_limited(result: dict[str, Any], is_error: bool, text: str | None) -> bool:
    if result.get("api_error_status") == 429:
        return True
    return is_error and text is not None and _RATE_LIMIT.search(text) is not None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
