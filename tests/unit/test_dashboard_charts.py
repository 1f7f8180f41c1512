"""The dashboard's chart series, from runs and the time: which run lands in which minute,
bucket, day and agent, and what is left out."""

from __future__ import annotations

from dataclasses import replace

from claude_support import agent_run

from corral.dashboard.charts import Window, charts
from corral.runs import AgentSpec, Run, RunStatus, RunType

# 2026-11-26 12:00:30 UTC: half a minute into a minute, noon of a day.
NOW = 1_795_694_430.0


def finished(
    status: RunStatus, *, ago_s: float, took_s: float, cost: float | None = None, agent: str = ""
) -> Run:
    run = agent_run(
        run_id="run_0123456789ab",
        now=NOW - ago_s - took_s,
        prompt="p",
        project_dir=None,
        agent=AgentSpec(name=agent, executor="claude") if agent else None,
    )
    return replace(
        run,
        type=RunType.START_SESSION if agent else RunType.COMMAND,
        status=status,
        cost_usd=cost,
        finished_at=NOW - ago_s,
    )


def test_runs_per_minute_count_each_outcome_in_the_minute_it_finished() -> None:
    runs = [
        finished(RunStatus.COMPLETED, ago_s=1, took_s=2),
        finished(RunStatus.COMPLETED, ago_s=20, took_s=2),
        finished(RunStatus.FAILED, ago_s=40, took_s=2),  # the minute before
        finished(RunStatus.TIMED_OUT, ago_s=3600, took_s=2),  # before the window
    ]
    series = charts(runs, Window(now=NOW, minutes=60, days=1))["runs_per_minute"]
    assert isinstance(series, list) and len(series) == 60
    assert series[-1]["minute"] == "2026-11-26T12:00:00+00:00"
    assert (series[-1]["completed"], series[-1]["failed"]) == (2, 0)
    assert (series[-2]["completed"], series[-2]["failed"]) == (0, 1)
    assert sum(minute["timed_out"] for minute in series) == 0


def test_durations_fall_in_the_first_bucket_that_holds_them() -> None:
    runs = [
        finished(RunStatus.COMPLETED, ago_s=5, took_s=0.5),
        finished(RunStatus.COMPLETED, ago_s=5, took_s=1.0),  # a bound is inclusive
        finished(RunStatus.FAILED, ago_s=5, took_s=30),
        finished(RunStatus.COMPLETED, ago_s=5, took_s=7200),
    ]
    buckets = charts(runs, Window(now=NOW, minutes=60, days=1))["durations"]
    assert buckets == [
        {"le": 1.0, "count": 2},
        {"le": 5.0, "count": 0},
        {"le": 15.0, "count": 0},
        {"le": 60.0, "count": 1},
        {"le": 300.0, "count": 0},
        {"le": 900.0, "count": 0},
        {"le": 3600.0, "count": 0},
        {"le": None, "count": 1},
    ]


def test_cost_is_summed_per_day_and_per_agent_and_unfinished_runs_are_left_out() -> None:
    day = 86400.0
    runs = [
        finished(RunStatus.COMPLETED, ago_s=60, took_s=1, cost=0.25, agent="researcher"),
        finished(RunStatus.FAILED, ago_s=day, took_s=1, cost=0.5, agent="researcher"),
        finished(RunStatus.COMPLETED, ago_s=60, took_s=1, cost=1.0, agent="claude"),
        finished(RunStatus.COMPLETED, ago_s=60, took_s=1),  # a command: no cost
        finished(RunStatus.COMPLETED, ago_s=3 * day, took_s=1, cost=9.0, agent="old"),
        replace(finished(RunStatus.RUNNING, ago_s=60, took_s=1, cost=5.0), finished_at=None),
    ]
    found = charts(runs, Window(now=NOW, minutes=60, days=2))
    assert found["cost_per_day"] == [
        {"day": "2026-11-25", "cost_usd": 0.5},
        {"day": "2026-11-26", "cost_usd": 1.25},
    ]
    assert found["cost_per_agent"] == [
        {"agent": "claude", "cost_usd": 1.0, "runs": 1},
        {"agent": "researcher", "cost_usd": 0.75, "runs": 2},
        {"agent": "command", "cost_usd": 0.0, "runs": 1},
    ]


def test_the_window_reaches_back_to_the_start_of_its_first_day() -> None:
    window = Window(now=NOW, minutes=60, days=2)
    assert window.since == NOW - 12 * 3600 - 30 - 86400
    assert Window(now=NOW, minutes=1440, days=1).since == NOW - 86400
