"""The coordinator's runner socket at its limits, with real sockets (helpers of
``test_socket_frames``):

* An event beyond the limits (a ``logs`` event of more lines than ``MAX_LOG_LINES``) closes
  the socket with 1008 ``corral.protocol_error:malformed_event``; nothing of its frame is
  stored or acknowledged (it was dropped *and* acknowledged before).
* An Init breaking the limits of ``POST /runner/register`` (slots 0 or beyond 64 bits, a
  name with a newline or too long, too many or too long labels, oversized metadata …)
  closes with 1008 ``corral.protocol_error:invalid_init`` and registers nothing (an Init
  with 0 slots used to raise inside the pump and leave the socket open for ever).
* Whatever raises while a socket is handled closes that socket with 1011
  ``corral.internal_error`` and frees what it held; the coordinator serves on.
"""

from __future__ import annotations

from typing import Any

import pytest
from api_fixtures import wait_until
from test_socket_frames import (
    Served,
    _init_frame,
    complete_a_run,
    events,
    logs,
    served,
    served_any,
    started,
)

from corral.coordinator.link_core import LinkCore
from corral.protocol import messages as m
from corral.protocol.limits import MAX_LOG_LINES

pytestmark = pytest.mark.anyio
__all__ = ["served", "served_any"]  # fixtures


async def test_an_event_over_the_limits_is_refused_not_dropped(served_any: Served) -> None:
    served = served_any
    peer = await served.connect()
    hello = await peer.init("runner-a")
    run_id = await served.create_run("seq", "9999")
    (command,) = (await peer.expect(m.ToClientCommands)).commands
    lines = [(n, str(n + 1)) for n in range(MAX_LOG_LINES + 1)]
    await peer.send(events(1, started(run_id), logs(run_id, *lines)))

    assert await peer.closed_with() == (
        m.CLOSE_POLICY_VIOLATION,
        m.protocol_error_reason(m.MALFORMED_EVENT),
    )
    assert await served.log_texts(run_id) == []
    assert (await served.run(run_id))["status"] == "claimed"  # its frame: nothing applied

    # Nothing was acknowledged: the runner sends it again, within the limits this time.
    again = await served.connect()
    back = await again.init("runner-a", runner_id=hello.runner_id, last_command_idx=command.idx)
    assert back.last_event_idx == 0
    await again.send(events(1, started(run_id), logs(run_id, *lines[:-1]), logs(run_id, lines[-1])))
    assert (await again.expect(m.ToClientAckEvents)).last_event_idx == 3
    texts = (await served.http.get(f"/runs/{run_id}/logs", params={"limit": 10000})).json()
    assert [line["text"] for line in texts["lines"]] == [t for _, t in lines]


BAD_INITS: dict[str, dict[str, Any]] = {
    "no_slots": {"total_slots": 0},
    "slots_beyond_the_limit": {"total_slots": 1025},
    "empty_name": {"name": ""},
    "name_with_a_newline": {"name": "evil\nINFO forged log line"},
    "name_too_long": {"name": "n" * 201},
    "name_with_a_lone_surrogate": {"name": "\ud800"},
    "version_too_long": {"version": "v" * 65},
    "label_too_long": {"labels": ["l" * 201]},
    "too_many_labels": {"labels": [f"l{i}" for i in range(65)]},
    "label_with_nul": {"labels": ["a\x00b"]},
    "hostname_with_a_newline": {"metadata": {"hostname": "a\nb"}},
    "hostname_not_text": {"metadata": {"hostname": 7}},
    "metadata_too_big": {"metadata": {"junk": "x" * 5000}},
    "runner_id_with_a_newline": {"runner_id": "rnr_1\n"},
}


@pytest.mark.parametrize("changes", BAD_INITS.values(), ids=BAD_INITS.keys())
async def test_an_init_beyond_the_runner_limits_is_refused(
    served: Served, changes: dict[str, Any]
) -> None:
    good = await served.connect()
    await good.init("good")
    bad = await served.connect()
    await bad.send_raw(_init_frame(**changes))
    assert await bad.closed_with() == (
        m.CLOSE_POLICY_VIOLATION,
        m.protocol_error_reason(m.INVALID_INIT),
    )
    assert [r["name"] for r in await served.runners()] == ["good"]
    await complete_a_run(served, good)


@pytest.mark.parametrize(
    "changes",
    [{"total_slots": 2**63}, {"total_slots": True}, {"last_command_idx": 2**63}],
    ids=["slots_beyond_64_bits", "slots_not_a_number", "index_beyond_64_bits"],
)
async def test_an_init_with_a_number_beyond_64_bits_is_refused(
    served: Served, changes: dict[str, Any]
) -> None:
    peer = await served.connect()
    await peer.send_raw(_init_frame(**changes))
    assert await peer.closed_with() == (
        m.CLOSE_POLICY_VIOLATION,
        m.protocol_error_reason(m.MALFORMED_FRAME),
    )
    assert await served.runners() == []


async def test_a_failure_while_registering_closes_the_socket(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("injected: the link core failed")

    monkeypatch.setattr(LinkCore, "register", broken)
    peer = await served.connect()
    await peer.send_raw(_init_frame(name="unlucky"))
    assert await peer.closed_with() == (m.CLOSE_INTERNAL_ERROR, m.REASON_INTERNAL_ERROR)
    monkeypatch.undo()

    good = await served.connect()
    await good.init("good")
    await complete_a_run(served, good)


async def test_a_failure_after_registering_closes_the_socket_and_frees_it(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    pushes = LinkCore.push_work

    def failing_push(core: LinkCore, *args: Any, **kwargs: Any) -> Any:
        if core.store.runners.get(args[0]).name == "unlucky":
            raise RuntimeError("injected: pushing work failed")
        return pushes(core, *args, **kwargs)

    monkeypatch.setattr(LinkCore, "push_work", failing_push)
    peer = await served.connect()
    hello = await peer.init("unlucky")
    assert await peer.closed_with() == (m.CLOSE_INTERNAL_ERROR, m.REASON_INTERNAL_ERROR)
    connections = served.coordinator.connections.by_runner
    await wait_until(lambda: hello.runner_id not in connections, what="the socket forgotten")

    good = await served.connect()
    await good.init("good")
    await complete_a_run(served, good)
