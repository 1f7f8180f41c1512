"""``corral runner`` whose runs start no process: each attempt completes at once (exit 0).

``dispatch.py`` uses it to measure the control plane alone — the coordinator, the link and
the runner core, every claim, command, report and acknowledgement — without the cost of
starting a process, which on a small machine is most of a real no-op run.

    python benchmarks/noop_runner.py runner --coordinator URL --slots 8 ...

With ``NOOP_STARTS`` set to a file, each attempt first appends ``<run id> <time.time()>``
to it: when the run started here, as a process would print its start time (``peers.py``
takes corral's enqueue → start latency from it, as it takes the peers' from their job's
first line).
"""

from __future__ import annotations

import os
import time

from corral.cli.main import main
from corral.runner.attempt import Attempt
from corral.runs import Run, RunReport, RunStatus

STARTS = os.environ.get("NOOP_STARTS")


async def _no_process(self: Attempt, run: Run) -> RunReport:
    if STARTS:
        started = time.time()
        with open(STARTS, "a") as starts:  # noqa: ASYNC230 - one short line, latency runs only
            starts.write(f"{run.id} {started}\n")
    return RunReport(RunStatus.COMPLETED, exit_code=0)


Attempt._supervise = _no_process  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
