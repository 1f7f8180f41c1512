"""The long-poll runner's commands (``PollTransport``), with a scripted link and host: each
control poll says the last command handled (which acknowledges it), a cancel reaches the
run it names, and a cancel that comes before its run's claim answer (two requests, either
may win) cancels the run as it starts instead of being lost."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from corral.ids import RunId, RunnerId
from corral.protocol.messages import Indexed
from corral.runner.link import Registration
from corral.runner.poll import PollTransport
from corral.runner.settings import RunnerSettings
from corral.runners import Held

pytestmark = pytest.mark.anyio
STEP_S = 10.0  # a bound on each wait, for correctness, not speed


class ScriptedLink:
    """Answers the runner's long-polls from queues the test fills; records the cursors."""

    def __init__(self) -> None:
        self.runs: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue()
        self.commands: asyncio.Queue[list[Indexed]] = asyncio.Queue()
        self.afters: list[int] = []  # ``after`` of each control poll

    async def register(self, **_: Any) -> Registration:
        return Registration(RunnerId("rnr_1"), 3600.0, 30.0, abandon=[])

    async def poll(self, runner_id: RunnerId, max_runs: int, timeout_s: float) -> Any:
        return await self.runs.get()

    async def control(self, runner_id: RunnerId, after: int, timeout_s: float) -> list[Indexed]:
        self.afters.append(after)
        return await self.commands.get()

    async def events(
        self, runner_id: RunnerId, events: list[dict[str, Any]], *_: Any
    ) -> list[None]:
        return [None for _ in events]

    async def deregister(self, runner_id: RunnerId) -> None:
        pass

    async def aclose(self) -> None:
        pass


class RecordingHost:
    """Holds the runs it is given; records what it was told, in order."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []
        self.holding: list[RunId] = []
        self.changed = asyncio.Event()

    @property
    def free_slots(self) -> int:
        return 4 - len(self.holding)

    def held(self) -> list[Held]:
        return [Held(r, 1) for r in self.holding]

    def start(self, assignment: dict[str, Any]) -> None:
        self.holding.append(RunId(assignment["run_id"]))
        self._tell("start", assignment["run_id"])

    def cancel(self, run_id: RunId) -> None:
        self._tell("cancel", run_id)

    def abandon(self, run_id: RunId) -> None:
        self._tell("abandon", run_id)

    def _tell(self, what: str, run_id: str) -> None:
        self.told.append((what, run_id))
        self.changed.set()

    async def slot_freed(self) -> None:
        await asyncio.Event().wait()

    async def until(self, count: int) -> None:
        while len(self.told) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), STEP_S)


async def eventually(condition: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + STEP_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the condition never held"
        await asyncio.sleep(0.001)


def cancel(idx: int, run_id: str) -> Indexed:
    return Indexed(idx, {"type": "cancel_run", "run_id": run_id})


async def test_commands_are_handled_in_order_and_acknowledged_by_the_next_poll() -> None:
    link, host = ScriptedLink(), RecordingHost()
    transport = PollTransport(host, RunnerSettings(), link=link)  # type: ignore[arg-type]
    await transport.open()
    serving = asyncio.create_task(transport.serve())
    try:
        link.runs.put_nowait([{"run_id": "run_a"}])
        await host.until(1)
        link.commands.put_nowait([cancel(1, "run_a")])
        await host.until(2)
        assert host.told == [("start", "run_a"), ("cancel", "run_a")]
        link.commands.put_nowait([])  # a 204: nothing came
        await eventually(lambda: len(link.afters) == 3)
        assert link.afters == [0, 1, 1]  # each poll says what was handled so far
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


async def test_a_cancel_before_its_claim_answer_cancels_the_run_as_it_starts() -> None:
    link, host = ScriptedLink(), RecordingHost()
    transport = PollTransport(host, RunnerSettings(), link=link)  # type: ignore[arg-type]
    await transport.open()
    serving = asyncio.create_task(transport.serve())
    try:
        link.commands.put_nowait([cancel(1, "run_b")])  # the claim's answer is still on its way
        await eventually(lambda: len(link.afters) == 2)  # handled: the next poll is out
        assert host.told == []  # it holds no such run yet
        link.runs.put_nowait([{"run_id": "run_b"}, {"run_id": "run_c"}])
        await host.until(3)
        assert host.told == [("start", "run_b"), ("cancel", "run_b"), ("start", "run_c")]
        assert link.afters == [0, 1]
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
