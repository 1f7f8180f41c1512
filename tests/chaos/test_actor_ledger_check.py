"""The chaos soak's actor invariants catch what they are there for (``check_actors``), on
ledgers made up here: a soak that passed with a blind check would prove nothing."""

from __future__ import annotations

from pathlib import Path

from actor_ledger import ActorLedger, ActorRequest, Hit, check_actors, read_ledger

T0 = 1_000.0
A = "act_1"


def request(name: str, status: int | None, body: str = "", code: str | None = None) -> ActorRequest:
    error = None if status is not None else "RemoteProtocolError: Server disconnected"
    return ActorRequest(name, A, "coordinator-a", T0, T0 + 1, status, body, code, error)


def hits(*spec: tuple[int, str, int]) -> ActorLedger:
    return ActorLedger([Hit(A, gen, name, count, T0) for gen, name, count in spec])


def violations(
    requests: list[ActorRequest],
    ledger: ActorLedger,
    kv: int = 2,
    downs: list[tuple[str, float, float]] = (),  # type: ignore[assignment]
) -> list[str]:
    return check_actors(requests, ledger, {A: kv}, list(downs)).violations


def test_answered_once_and_counted_once_passes() -> None:
    ledger = hits((1, "q1", 1), (2, "q2", 2))
    answers = [request("q1", 200, "1"), request("q2", 503, '{"code": "x"}', "tunnel_lost")]
    assert violations(answers, ledger) == []


def test_a_request_run_twice_is_caught() -> None:
    ledger = hits((1, "q1", 1), (2, "q1", 2))
    assert any("ran 2 times" in v for v in violations([request("q1", 200, "1")], ledger))


def test_a_200_the_actor_never_ran_or_counted_otherwise_is_caught() -> None:
    assert any("never ran" in v for v in violations([request("q1", 200, "1")], hits(), kv=0))
    ledger = hits((1, "q1", 1))
    assert any("counted 1" in v for v in violations([request("q1", 200, "7")], ledger, kv=1))


def test_a_failure_without_a_code_or_below_500_is_caught() -> None:
    assert any("without a code" in v for v in violations([request("q1", 502, "bad")], hits()))
    assert any("without a code" in v for v in violations([request("q1", 404, "", "x")], hits()))


def test_no_answer_is_allowed_only_while_its_coordinator_was_killed() -> None:
    lost = [request("q1", None)]
    assert any("not killed" in v for v in violations(lost, hits(), kv=0))
    downs = [("coordinator-a", T0 + 0.5, T0 + 3)]
    assert violations(lost, hits(), kv=0, downs=downs) == []
    other = [("coordinator-b", T0 + 0.5, T0 + 3)]
    assert any("not killed" in v for v in violations(lost, hits(), kv=0, downs=other))
    refused = [request("q1", None)]
    refused[0].error = "ConnectError: [Errno 111] Connection refused"
    assert violations(refused, hits(), kv=0) == []


def test_a_request_that_waited_out_its_timeout_hung_whatever_was_killed() -> None:
    """A killed coordinator cuts its connections at once: only a live one leaves a client
    waiting, so a timeout is a hang even while that coordinator was killed and restarted."""
    hung = [request("q1", None)]
    hung[0].error = "ReadTimeout: timed out"
    downs = [("coordinator-a", T0 + 0.5, T0 + 3)]
    assert any("a hang" in v for v in violations(hung, hits(), kv=0, downs=downs))


def test_a_counter_going_back_or_counting_twice_is_caught() -> None:
    back = hits((1, "q1", 1), (1, "q2", 2), (2, "q3", 2))
    assert any("went from 2" in v for v in violations([], back))
    assert any("below" in v for v in violations([], hits((1, "q1", 1), (1, "q2", 2)), kv=1))


def test_an_overlap_of_generations_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "ledger"
    path.write_text(
        f"start {A} 1 100 {T0}\nhit {A} 1 q1 1 {T0}\noverlap {A} 2 101 {T0}\nstart {A} 2 101 {T0}\n"
        f"hit {A} 2 q2"  # cut short by a kill
    )
    ledger = read_ledger(path)
    assert ledger.starts[A] == 2 and [h.request for h in ledger.hits] == ["q1"]
    assert any("two live generations" in v for v in violations([], ledger, kv=1))
