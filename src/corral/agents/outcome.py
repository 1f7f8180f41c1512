"""How a stopped process is reported, the same for every executor."""

from __future__ import annotations

from corral.agents.base import StopReason
from corral.runs import RunReport, RunStatus

_STOPPED = {
    StopReason.TIMEOUT: (RunStatus.TIMED_OUT, "run exceeded its timeout"),
    StopReason.IDLE_TIMEOUT: (RunStatus.TIMED_OUT, "no output within the idle timeout"),
    StopReason.CANCELLED: (RunStatus.CANCELLED, "cancelled"),
    StopReason.LINGERED_AFTER_RESULT: (
        RunStatus.FAILED,
        "process did not exit after its result and was killed",
    ),
}


def stopped_report(reason: StopReason, exit_code: int | None) -> RunReport:
    if reason is StopReason.RUNNER_SHUTDOWN:
        # The runner is going away: give the attempt back so another runner takes the run.
        return RunReport(
            RunStatus.PENDING, exit_code=exit_code, error="runner shut down", retry_after_s=0.0
        )
    status, message = _STOPPED[reason]
    return RunReport(status, exit_code=exit_code, error=message)
