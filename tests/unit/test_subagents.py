"""The sub-agent rules (corral.subagents): depth, fan-out and budget limits with their
codes, and the planning of callbacks: batched per parent, held while it is busy, dropped
when it is gone."""

from __future__ import annotations

import pytest

from corral.errors import Conflict, InvalidRequest
from corral.subagents import (
    ChildResult,
    Delivery,
    Dropped,
    Limits,
    Parent,
    ParentState,
    PendingCallback,
    callback_prompt,
    check_spawn,
    plan_deliveries,
)

LIMITS = Limits(max_depth=2, max_children=2, max_batch=3)


def _child(run_id: str, finished_at: float, **fields: object) -> ChildResult:
    values: dict[str, object] = {
        "session_name": f"child-{run_id}",
        "session_id": f"sess-{run_id}",
        "status": "completed",
        "result": f"result of {run_id}",
        "error": None,
        "cost_usd": 0.5,
    }
    values.update(fields)
    return ChildResult(run_id=run_id, finished_at=finished_at, **values)  # type: ignore[arg-type]


def test_a_child_is_one_deeper_than_its_parent() -> None:
    assert check_spawn(Parent("root", depth=0, active_children=0), LIMITS) == 1
    assert check_spawn(Parent("mid", depth=1, active_children=1), LIMITS) == 2


@pytest.mark.parametrize(
    ("parent", "kind", "code"),
    [
        (Parent("deep", depth=2, active_children=0), InvalidRequest, "depth_exceeded"),
        (Parent("busy", depth=0, active_children=2), Conflict, "fan_out_exceeded"),
        (
            Parent("spent", depth=0, active_children=0, budget_usd=1.0, cost_with_children_usd=1.0),
            Conflict,
            "budget_exceeded",
        ),
    ],
)
def test_a_child_over_a_limit_is_refused_with_its_code(
    parent: Parent, kind: type[Exception], code: str
) -> None:
    with pytest.raises(kind) as refused:
        check_spawn(parent, LIMITS)
    assert getattr(refused.value, "code", None) == code


def test_a_budget_not_yet_spent_lets_a_child_start() -> None:
    parent = Parent("p", depth=0, active_children=0, budget_usd=1.0, cost_with_children_usd=0.99)
    assert check_spawn(parent, LIMITS) == 1


def test_children_that_ended_together_come_back_in_one_resume_in_the_order_they_ended() -> None:
    pending = [
        PendingCallback("p", _child("b", 20.0)),
        PendingCallback("p", _child("a", 10.0)),
        PendingCallback("q", _child("c", 15.0)),
    ]
    parents = {"p": ParentState("p", exists=True, busy=False), "q": ParentState("q", True, False)}
    deliveries, dropped = plan_deliveries(pending, parents, LIMITS)
    assert dropped == []
    assert [(d.parent_session_id, [c.run_id for c in d.children]) for d in deliveries] == [
        ("p", ["a", "b"]),
        ("q", ["c"]),
    ]


def test_a_busy_parent_waits_and_a_gone_one_drops_its_callbacks() -> None:
    pending = [
        PendingCallback("busy", _child("a", 1.0)),
        PendingCallback("gone", _child("b", 2.0)),
        PendingCallback("unknown", _child("c", 3.0)),
    ]
    parents = {"busy": ParentState("busy", True, True), "gone": ParentState("gone", False, False)}
    deliveries, dropped = plan_deliveries(pending, parents, LIMITS)
    assert deliveries == []
    assert dropped == [Dropped("b", "gone", "parent_gone"), Dropped("c", "unknown", "parent_gone")]


def test_a_batch_holds_at_most_max_batch_children_the_rest_come_next() -> None:
    pending = [PendingCallback("p", _child(str(i), float(i))) for i in range(5)]
    (delivery,), _ = plan_deliveries(pending, {"p": ParentState("p", True, False)}, LIMITS)
    assert [c.run_id for c in delivery.children] == ["0", "1", "2"]


def test_the_callback_message_names_each_child_and_its_result_or_error() -> None:
    failed = _child("f", 2.0, status="failed", result=None, error="exit 3", cost_usd=None)
    prompt = Delivery("p", (_child("a", 1.0), failed)).prompt
    assert prompt == callback_prompt([_child("a", 1.0), failed])
    assert prompt.splitlines() == [
        "Sub-agent sessions you started have ended:",
        "",
        "## child-a (completed, $0.5000; run a)",
        "result of a",
        "",
        "## child-f (failed; run f)",
        "(no result: exit 3)",
    ]


def test_a_parent_whose_children_spent_its_budget_is_not_resumed() -> None:
    pending = [PendingCallback("p", _child("c1", 1.0))]
    parents = {"p": ParentState("p", exists=True, busy=False, over_budget=True)}
    assert plan_deliveries(pending, parents, LIMITS) == (
        [],
        [Dropped("c1", "p", "budget_exceeded")],
    )
    busy = {"p": ParentState("p", exists=True, busy=True, over_budget=True)}
    assert plan_deliveries(pending, busy, LIMITS) == ([], [])  # decided once it is idle


def test_a_command_child_is_held_back_by_fan_out_and_budget_but_not_by_depth() -> None:
    deepest = Parent("p", depth=2, active_children=0)
    assert check_spawn(deepest, LIMITS, nests=False) == 3
    with pytest.raises(InvalidRequest):
        check_spawn(deepest, LIMITS)
    with pytest.raises(Conflict) as caught:
        check_spawn(Parent("p", depth=2, active_children=2), LIMITS, nests=False)
    assert caught.value.code == "fan_out_exceeded"


def test_a_command_child_comes_back_with_its_exit_code_and_last_output_lines() -> None:
    command = _child(
        "c",
        2.0,
        session_name=None,
        session_id=None,
        status="failed",
        result=None,
        error="exit code 3",
        cost_usd=None,
        command=("sh", "-c", "make test"),
        exit_code=3,
        output=("1 failed", "done"),
    )
    silent = _child("s", 3.0, command=("true",), exit_code=0, output=(), status="completed")
    assert callback_prompt([_child("a", 1.0), command, silent]).splitlines() == [
        "Sub-agent sessions and commands you started have ended:",
        "",
        "## child-a (completed, $0.5000; run a)",
        "result of a",
        "",
        "## command `sh -c 'make test'` (failed, exit code 3; run c)",
        "1 failed",
        "done",
        "",
        "## command `true` (completed, exit code 0; run s)",
        "(no output)",
    ]
