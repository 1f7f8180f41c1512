"""How many runners a serverless pool wants: the pure rule, clamp(ceil(slots / per runner)
+ margin, min, max)."""

from __future__ import annotations

import pytest

from corral.pools import Serverless, desired_runners


@pytest.mark.parametrize(
    ("slots", "per_runner", "margin", "least", "most", "desired"),
    [
        (0, 1, 0, 0, 10, 0),  # nothing wanted: no runner
        (1, 1, 0, 0, 10, 1),  # seed 002: one sleeping actor woken → desired 1
        (3, 2, 0, 0, 10, 2),  # rounded up
        (4, 2, 0, 0, 10, 2),
        (4, 2, 1, 0, 10, 3),  # warm margin on top
        (0, 4, 1, 0, 10, 1),
        (0, 1, 0, 2, 10, 2),  # at least min_runners
        (50, 1, 0, 0, 10, 10),  # at most max_runners
        (50, 1, 5, 0, 10, 10),
        (-1, 1, 0, 0, 10, 0),  # never fewer than nothing
    ],
)
def test_desired_runners(
    slots: int, per_runner: int, margin: int, least: int, most: int, desired: int
) -> None:
    config = Serverless(
        url="http://127.0.0.1:1",
        slots_per_runner=per_runner,
        margin=margin,
        min_runners=least,
        max_runners=most,
    )
    assert desired_runners(slots, config) == desired
