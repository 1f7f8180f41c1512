"""How the CLI shows money, times and plain tables."""

from __future__ import annotations

import time

import pytest

from corral.cli.output import local_time, money, plain_table


def test_money() -> None:
    assert money(0.037500000000000006) == "$0.0375"
    assert money(0) == "$0.00"
    assert money(2.5) == "$2.50"
    assert money(1234.5) == "$1,234.50"
    assert money(None) == ""


def test_local_time_names_its_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    try:
        assert local_time("2026-11-26T05:00:00+00:00") == "2026-11-26 06:00:00 CET"
        assert local_time(None) == ""
    finally:
        monkeypatch.undo()
        time.tzset()


def test_plain_table_aligns_without_borders_or_cuts() -> None:
    text = plain_table(["run", "error"], [["run_1", "x" * 300], ["run_22", ""]])
    assert text.splitlines() == ["run     error", "run_1   " + "x" * 300, "run_22"]
