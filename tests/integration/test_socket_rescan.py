"""The re-scan after the wake-up listener reconnected (``Coordinator.rescan``): every waiter
looks again, but of the runner sockets held here only those whose runner's row has
something they have not passed on — one read of the rows, not a look per socket."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from api_fixtures import running_api

from corral.coordinator.link_core import Pushed, RunnerChannel
from corral.coordinator.notifier import logs_topic, runner_topic
from corral.coordinator.settings import CoordinatorSettings
from corral.protocol.messages import Indexed
from corral.runners import RunnerState
from corral.store.runners import Head

pytestmark = pytest.mark.anyio


@dataclass
class Link:
    """A socket as the re-scan sees it: its channel, which knows what it sent."""

    channel: RunnerChannel

    def behind(self, head: Head) -> bool:
        return self.channel.behind(head)


def link_that_sent(settings: CoordinatorSettings, last_idx: int) -> Link:
    channel = RunnerChannel.open(1, 0.0, settings)
    if last_idx:
        channel.pushed(Pushed([Indexed(last_idx, {"type": "cancel_run", "run_id": "r"})]))
    return Link(channel)


async def test_only_sockets_whose_runner_changed_look_again(db_url: str) -> None:
    settings = CoordinatorSettings(db_url=db_url)
    async with running_api(settings) as api:
        coordinator, store = api.coordinator, api.coordinator.store
        quiet, commanded, drained, caught_up, polling = [
            await api.register(f"runner-{i}") for i in range(5)
        ]
        now = coordinator.clock.now()
        for runner in (commanded, caught_up):
            store.commands.push(runner, [{"type": "cancel_run", "run_id": "r"}], now)
        store.runners.set_state(drained, RunnerState.DRAINING, now, grace_s=60.0)
        links = {
            quiet: link_that_sent(settings, 0),
            commanded: link_that_sent(settings, 0),  # its command was stored, not sent
            drained: link_that_sent(settings, 0),
            caught_up: link_that_sent(settings, 1),  # it sent the one stored
        }
        coordinator.connections.by_runner.update(links)  # type: ignore[arg-type]
        notifier = coordinator.notifier
        # Held across the re-scan, as each waiter holds its topic's event while it waits.
        events = {r: notifier.event(runner_topic(r)) for r in (*links, polling)}
        logs = notifier.event(logs_topic("run_1"))

        await coordinator.rescan()

        woken = {r for r, event in events.items() if event.is_set()}
        assert woken == {commanded, drained, polling}  # a long-poll runner's wait: as before
        assert logs.is_set()
