"""The command executor: an argv list; exit code 0 means completed."""

from __future__ import annotations

from corral.agents.base import Observation, OutputObserver, ProcessSpec, StopReason
from corral.agents.outcome import stopped_report
from corral.assignment import Assignment
from corral.runs import RunReport, RunStatus


class CommandExecutor:
    host_env: tuple[str, ...] = ()
    missing_program_hint = ""

    def prepare(self, run: Assignment, base_env: dict[str, str]) -> ProcessSpec:
        return ProcessSpec(argv=run.command, cwd=run.project_dir, env={**base_env, **run.env})

    def observer(self, run: Assignment) -> OutputObserver:
        return _ExitCodeObserver()


class _ExitCodeObserver:
    def feed(self, line: str) -> list[Observation]:
        return []

    def outcome(self, exit_code: int | None, stopped: StopReason | None) -> RunReport:
        if stopped is not None:
            return stopped_report(stopped, exit_code)
        if exit_code == 0:
            return RunReport(RunStatus.COMPLETED, exit_code=0)
        return RunReport(
            RunStatus.FAILED, exit_code=exit_code, error=f"process exited with code {exit_code}"
        )
