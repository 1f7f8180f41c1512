"""Finished work is not run again (issue 16 §2), end to end: a real ``corral serve`` on
SQLite or PostgreSQL, a real runner (WebSocket or long-poll) behind the fault proxy
(``faultproxy.py``).

The chaos soak's case: a run finishes while its final report cannot reach the store, for
longer than the runner's lease. The coordinator declares the runner lost and puts the run
back to pending for the same attempt; the runner stops its work and comes back under a new
identity. Its final report, carried over to that identity, still ends the run: completed
once, attempt 1, its process run once — instead of being claimed again and run a second
time. And when that attempt was the run's last, the run waits lost for the report (a grace
of the runner's threshold) instead of failing: it ends completed, not failed.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from e2e_support import Cluster, Coordinator, wait_until
from faultproxy import CutMode, FaultProxy

LOST_THRESHOLD_S = 3.0
# For the lost last attempt: its grace is the runner's threshold, counted from the loss.
GRACE_THRESHOLD_S = 5.0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, cluster: Cluster) -> str:
    if request.param == "sqlite":
        return str(cluster.root / "corral.db")
    pg_url: str = request.getfixturevalue("pg_url")
    schema: str = request.getfixturevalue("pg_schema")
    options = quote(f"-csearch_path={schema}")
    return f"{pg_url}{'&' if '?' in pg_url else '?'}options={options}"


def start_coordinator(
    cluster: Cluster, db: str, threshold_s: float = LOST_THRESHOLD_S, **kw: float
) -> Coordinator:
    coordinator = cluster.start_coordinator(
        db=db,
        extra=("--runner-lost-threshold", str(threshold_s), "--ping-interval", "1"),
        **kw,
    )
    return coordinator


def ledger_script(gate: Path, ledger: Path) -> list[str]:
    """A run that waits for ``gate``, then writes its side effect: one line in ``ledger``
    (each execution that gets that far adds one)."""
    script = (
        f'while [ ! -e "{gate}" ]; do sleep 0.05; done; echo "done $$" >> "{ledger}"; echo finished'
    )
    return ["sh", "-c", script]


@pytest.mark.parametrize("transport", ["websocket", "poll"])
def test_a_run_done_while_its_report_could_not_get_through_is_not_run_again(
    cluster: Cluster, db: str, tmp_path: Path, transport: str
) -> None:
    """On WebSocket, the runner comes back under a new identity and sends the report as
    its former one's; on long-poll, it registers its identity again and sends the report
    before it claims anything (two slots: one would be free for the run)."""
    coordinator = start_coordinator(cluster, db)
    with FaultProxy(coordinator.port) as proxy:
        runner = cluster.start_runner(
            "runner-a", slots=2, url=proxy.url, extra=("--transport", transport)
        )
        first_id = cluster.wait_runner("runner-a")
        gate, ledger = tmp_path / "gate", tmp_path / "ledger"
        command = ledger_script(gate, ledger)
        run_id = cluster.client.create_run(type="command", command=command)["run_id"]
        cluster.wait_run(run_id, {"running"})

        # The coordinator's end of the link vanishes (what the runner sends is lost, as
        # when the store it would be written to is away) and the runner cannot get back.
        proxy.refusing = True
        assert proxy.cut_all("server") >= 1
        gate.touch()  # the run finishes now: its final report waits for an ack
        wait_until(lambda: ledger.exists() and ledger.read_text().count("done") == 1, 10)

        # Away past its lease: the coordinator takes the run back for the same attempt, the
        # runner stops its work and gives up its identity.
        taken_back = cluster.wait_run(run_id, {"pending"}, timeout=30)
        assert taken_back["attempts"] == 1 and taken_back["runner_id"] is None, taken_back
        wait_until(lambda: "stopping all work" in runner.log(), 15, what="the lease to end")

        proxy.refusing = False
        run = cluster.wait_run(run_id, timeout=30)
        second_id = cluster.wait_runner("runner-a")
        if transport == "websocket":
            assert second_id != first_id
            assert cluster.runner_by_id(first_id)["state"] == "lost"
            assert "reports of work done under the former id sent again" in runner.log()
        else:
            assert second_id == first_id  # a long-poll runner keeps its id

        assert run["status"] == "completed", run
        assert (run["attempts"], run["runner_id"], run["exit_code"]) == (1, first_id, 0), run
        assert [line["text"] for line in cluster.client.logs(run_id)["lines"]] == ["finished"]
        # The new identity goes on working (its hold on claims is over) — and the first
        # run is not among its work: its side effect happened once.
        other = cluster.client.create_run(type="command", command=["echo", "next"])["run_id"]
        assert cluster.wait_run(other)["runner_id"] == second_id
        assert ledger.read_text().count("done") == 1
        assert cluster.client.get_run(run_id)["attempts"] == 1


# How the link is cut: for the WebSocket runner as above (its report is sent again on its
# next socket); for the long-poll runner both ends are reset, as when the link crashed. (Cut
# on the coordinator's side only, a report it posted on a pooled connection hangs for the
# client's timeout, 30 s: past a grace of a few seconds, though not the default's 120 s.)
@pytest.mark.parametrize(("transport", "cut"), [("websocket", "server"), ("poll", "both")])
def test_a_last_attempt_done_while_its_runner_was_cut_off_ends_completed(
    cluster: Cluster, db: str, tmp_path: Path, transport: str, cut: CutMode
) -> None:
    """The run's only attempt finishes while its runner is cut off past its lease: the
    coordinator declares the runner lost, and the run, with no attempt left to run again,
    waits lost (not failed) for the runner's report. The runner gets back within that grace
    (the runner's threshold) and the run ends completed, as it did."""
    coordinator = start_coordinator(
        cluster, db, threshold_s=GRACE_THRESHOLD_S, lost_after_s=GRACE_THRESHOLD_S
    )
    with FaultProxy(coordinator.port) as proxy:
        runner = cluster.start_runner(
            "runner-a", slots=2, url=proxy.url, extra=("--transport", transport)
        )
        first_id = cluster.wait_runner("runner-a")
        gate, ledger = tmp_path / "gate", tmp_path / "ledger"
        command = ledger_script(gate, ledger)
        run_id = cluster.client.create_run(type="command", command=command, max_attempts=1)[
            "run_id"
        ]
        cluster.wait_run(run_id, {"running"})

        proxy.refusing = True
        assert proxy.cut_all(cut) >= 1
        gate.touch()  # the run finishes now, its runner cut off
        wait_until(lambda: ledger.exists() and ledger.read_text().count("done") == 1, 10)

        waiting = cluster.wait_run(run_id, {"lost", "failed"}, timeout=30)
        assert waiting["status"] == "lost", waiting
        assert (waiting["attempts"], waiting["runner_id"], waiting["finished_at"]) == (
            1,
            first_id,
            None,
        )
        wait_until(lambda: "stopping all work" in runner.log(), 15, what="the lease to end")

        proxy.refusing = False
        run = cluster.wait_run(run_id, timeout=30)
        assert run["status"] == "completed", run
        assert (run["attempts"], run["runner_id"], run["exit_code"]) == (1, first_id, 0), run
        assert [line["text"] for line in cluster.client.logs(run_id)["lines"]] == ["finished"]
        assert ledger.read_text().count("done") == 1
