"""The chaos soak's invariants catch what they are there for (``chaos_ledger.check``), on
ledgers made up here: a soak that passed with a blind check would prove nothing."""

from __future__ import annotations

from typing import Any

from chaos_ledger import Disruption, Entry, Job, check

T0 = 1_000.0


def run(status: str, attempts: int = 1, exit_code: int | None = 0) -> dict[str, Any]:
    return {
        "run_id": "run_1",
        "status": status,
        "attempts": attempts,
        "exit_code": exit_code,
        "error": None,
        "command": ["sh", "-c", "…", "j1", "1", "0"],
    }


def entries(*spec: tuple[str, int, float]) -> list[Entry]:
    return [Entry(event, "run_1", attempt, "j1", T0 + at) for event, attempt, at in spec]


def lost(attempts: int, at: float, runner_id: str = "rnr_a") -> dict[str, Any]:
    return {"at": T0 + at, "runner_id": runner_id, "data": {"status": "lost", "attempts": attempts}}


JOB = Job("j1", "short", "completed", 0, T0, run_id="run_1")
NAMES = {"rnr_a": "ws-1"}
KILLED = [Disruption("kill", "ws-1", T0 + 2, T0 + 4)]


def violations(
    the_run: dict[str, Any] | None,
    ledger: list[Entry],
    events: list[dict[str, Any]] = (),  # type: ignore[assignment]
    disruptions: list[Disruption] = KILLED,
    *,
    settled: bool = True,
    job: Job = JOB,
) -> list[str]:
    runs = {"run_1": the_run} if the_run else {}
    verdict = check(
        [job], runs, ledger, {"run_1": list(events)}, NAMES, disruptions, settled=settled
    )
    return verdict.violations


def test_a_run_done_once_is_fine() -> None:
    assert violations(run("completed"), entries(("start", 1, 0), ("done", 1, 1))) == []


def test_a_second_attempt_after_a_proven_loss_is_fine() -> None:
    ledger = entries(("start", 1, 0), ("start", 2, 8), ("done", 2, 9))
    assert violations(run("completed", attempts=2), ledger, [lost(1, 6)]) == []


def test_the_same_attempt_started_twice() -> None:
    ledger = entries(("start", 1, 0), ("start", 1, 2), ("done", 1, 3))
    assert violations(run("completed"), ledger) == [
        "short run run_1 (j1): attempt 1 started 2 times"
    ]


def test_a_second_attempt_with_no_runner_cut_off() -> None:
    ledger = entries(("start", 1, 0), ("start", 2, 8), ("done", 2, 9))
    found = violations(run("completed", attempts=2), ledger, [lost(1, 6)], disruptions=[])
    assert len(found) == 1 and "no lease of it lost while its runner was cut off" in found[0]
    found = violations(run("completed", attempts=2), ledger, [])  # nor a lost event
    assert len(found) == 1 and "no lease of it lost" in found[0]


def test_an_attempt_working_on_beside_the_next() -> None:
    ledger = entries(("start", 1, 0), ("start", 2, 8), ("done", 1, 9), ("done", 2, 10))
    found = violations(run("completed", attempts=2), ledger, [lost(1, 6)])
    assert found == ["short run run_1 (j1): attempt 1 went on working beside attempt 2"]


def test_an_attempt_the_api_does_not_know() -> None:
    found = violations(run("completed"), entries(("start", 1, 0), ("start", 2, 5), ("done", 2, 6)))
    assert any("attempt 2 ran, the API knows 1" in f for f in found)


def test_lost_stuck_and_wrong_endings() -> None:
    assert violations(None, []) == ["short run run_1 (j1) is gone from the API"]
    stuck = violations(run("running"), entries(("start", 1, 0)))
    assert stuck == ["short run run_1 (j1) ended running, not completed (error: None)"]
    assert violations(run("running"), entries(("start", 1, 0)), settled=False) == []
    undone = violations(run("completed"), entries(("start", 1, 0)))
    assert undone == ["short run run_1 (j1) is completed, but its attempt 1 did no work"]
    failing = Job("j1", "fail", "failed", 3, T0, run_id="run_1")
    wrong_code = violations(
        run("failed", exit_code=1), entries(("start", 1, 0), ("done", 1, 1)), job=failing
    )
    assert wrong_code == ["fail run run_1 (j1) exited 1, not 3"]


def test_a_creation_whose_answer_was_lost_is_found_by_its_key() -> None:
    unanswered = Job("j1", "short", "completed", 0, T0)  # no run id
    assert (
        violations(run("completed"), entries(("start", 1, 0), ("done", 1, 1)), job=unanswered) == []
    )
    stuck = violations(run("pending", attempts=0), [], job=unanswered)
    assert stuck == ["short run run_1 (j1) ended pending, not completed (error: None)"]


def test_a_job_created_twice() -> None:
    """Its create sent again after an unknown outcome must get its run (the idempotency
    key), not make another."""
    twice = {"run_1": run("completed"), "run_2": {**run("completed"), "run_id": "run_2"}}
    ledger = entries(("start", 1, 0), ("done", 1, 1))
    verdict = check([JOB], twice, ledger, {}, NAMES, KILLED, settled=True)
    assert verdict.violations == ["short job j1 has 2 runs"]
