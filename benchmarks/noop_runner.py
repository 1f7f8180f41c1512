"""``corral runner`` whose runs start no process: each attempt completes at once (exit 0).

``dispatch.py`` uses it to measure the control plane alone — the coordinator, the link and
the runner core, every claim, command, report and acknowledgement — without the cost of
starting a process, which on a small machine is most of a real no-op run.

    python benchmarks/noop_runner.py runner --coordinator URL --slots 8 ...
"""

from __future__ import annotations

from corral.cli.main import main
from corral.runner.attempt import Attempt
from corral.runs import Run, RunReport, RunStatus


async def _no_process(self: Attempt, run: Run) -> RunReport:
    return RunReport(RunStatus.COMPLETED, exit_code=0)


Attempt._supervise = _no_process  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
