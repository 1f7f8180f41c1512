"""What the dashboard's charts show, computed from runs: runs per minute by outcome, the
distribution of durations, cost per day and per agent. Pure: runs and the time in."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from corral.runs import Run, RunStatus

# Upper bounds (seconds) of the duration histogram's buckets; the last one is open.
DURATION_BOUNDS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)
OUTCOMES = tuple(s.value for s in RunStatus if s.is_terminal)
DAY_S = 86400.0


@dataclass(frozen=True)
class Window:
    """The time the charts cover: the last ``minutes`` minutes, and the last ``days`` days."""

    now: float
    minutes: int
    days: int

    @property
    def since(self) -> float:
        """The oldest instant any chart looks at."""
        return min(self.now - self.minutes * 60.0, _day_start(self.now) - (self.days - 1) * DAY_S)


def charts(runs: Iterable[Run], window: Window) -> dict[str, object]:
    """The charts' series, from the finished runs among ``runs`` (each once): runs per
    minute over the last ``minutes``; durations, cost per day and per agent over ``days``."""
    minute_now = int(window.now // 60)
    first_minute = minute_now - window.minutes + 1
    per_minute = {m: dict.fromkeys(OUTCOMES, 0) for m in range(first_minute, minute_now + 1)}
    durations = [0] * (len(DURATION_BOUNDS) + 1)
    first_day = _day_start(window.now) - (window.days - 1) * DAY_S
    per_day = {_day(first_day + i * DAY_S): 0.0 for i in range(window.days)}
    per_agent: dict[str, dict[str, float]] = {}
    for run in runs:
        if not run.status.is_terminal or run.finished_at is None:
            continue
        minute = int(run.finished_at // 60)
        if minute in per_minute:
            per_minute[minute][run.status.value] += 1
        if run.finished_at < first_day:
            continue
        if run.started_at is not None:
            durations[bisect.bisect_left(DURATION_BOUNDS, run.finished_at - run.started_at)] += 1
        day = _day(run.finished_at)
        if day in per_day:
            per_day[day] += run.cost_usd or 0.0
        agent = per_agent.setdefault(_agent(run), {"cost_usd": 0.0, "runs": 0})
        agent["cost_usd"] += run.cost_usd or 0.0
        agent["runs"] += 1
    return {
        "minutes": window.minutes,
        "days": window.days,
        "outcomes": list(OUTCOMES),
        "runs_per_minute": [
            {"minute": _iso(m * 60.0), **counts} for m, counts in per_minute.items()
        ],
        "durations": [
            {"le": bound, "count": durations[i]} for i, bound in enumerate(DURATION_BOUNDS)
        ]
        + [{"le": None, "count": durations[-1]}],
        "cost_per_day": [{"day": day, "cost_usd": round(cost, 6)} for day, cost in per_day.items()],
        "cost_per_agent": [
            {"agent": name, "cost_usd": round(v["cost_usd"], 6), "runs": int(v["runs"])}
            for name, v in sorted(per_agent.items(), key=lambda kv: (-kv[1]["cost_usd"], kv[0]))
        ],
    }


def _agent(run: Run) -> str:
    """An agent run by its profile's name; a command or task run by its kind."""
    return run.agent_name or str(run.type)


def _day_start(ts: float) -> float:
    return ts - ts % DAY_S


def _day(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).date().isoformat()


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()
