"""A run's output on its way to the coordinator: the pure pieces (``corral.runner.output``)
and the runner's core running real processes, its reports caught by an in-memory sink.

* Lines longer than the runner's line limit (injected small here; one real case past the
  64 MiB default) are cut with a marker saying how many bytes were cut, and the lines after
  them are kept; the run ends with its final report. (A line over 64 MiB without a newline
  used to make the reader raise: no final report, the slot held for ever.)
* Every ``logs`` report fits the limits the coordinator holds it to; NUL is kept as U+FFFD.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from typing import Any

import pytest

from corral.protocol.limits import MAX_EVENT_BYTES, MAX_LOG_LINES, json_size, text_size
from corral.runner.core import RunnerCore
from corral.runner.output import LineSplitter, LogLines, cut_marker, stored_text
from corral.runner.settings import RunnerSettings

STEP_S = 60.0  # a bound on each wait, for correctness, not speed


# ---- the pure pieces ------------------------------------------------------------------------


def test_the_splitter_cuts_long_lines_and_keeps_reading() -> None:
    splitter = LineSplitter(max_line_bytes=4)
    lines = splitter.feed(b"ab\nabcdefg") + splitter.feed(b"hij\n\nxy") + splitter.feed(b"z")
    lines += splitter.end()
    assert [(line.data, line.cut) for line in lines] == [
        (b"ab", 0),
        (b"abcd", 6),
        (b"", 0),
        (b"xyz", 0),
    ]
    assert splitter.end() == []


def test_a_line_split_across_reads_is_whole() -> None:
    splitter = LineSplitter(max_line_bytes=100)
    data = b"".join(f"{n}\n".encode() for n in range(1000))
    lines = [line for i in range(0, len(data), 7) for line in splitter.feed(data[i : i + 7])]
    assert [line.data.decode() for line in lines] == [str(n) for n in range(1000)]


def test_stored_text_marks_every_cut() -> None:
    assert stored_text("short") == "short"
    assert stored_text("abc", cut_bytes=10) == "abc" + cut_marker(10)
    assert stored_text("a\x00b") == "a\ufffdb"
    long = "é" * 100_000  # 2 bytes in UTF-8, 6 encoded as JSON
    kept = stored_text(long, max_bytes=10_000)
    assert text_size(kept) <= 10_000
    prefix = kept.split(" [corral: ")[0]
    assert set(prefix) == {"é"} and len(prefix) > 1500  # nearly all the room is used
    assert kept == prefix + cut_marker(2 * (len(long) - len(prefix)))


def test_log_lines_come_out_as_events_within_the_limits() -> None:
    lines = LogLines()
    texts = [str(n) for n in range(12_000)] + ["y" * 700_000] * 5
    for n, text in enumerate(texts):
        lines.add(n, "stdout", text, 1.0)
    chunks = lines.take()
    assert [line["text"] for chunk in chunks for line in chunk] == texts
    for chunk in chunks:
        assert len(chunk) <= MAX_LOG_LINES
        event = {"type": "logs", "run_id": "run_000000000000", "attempt": 1, "lines": chunk}
        assert json_size(event) <= MAX_EVENT_BYTES
    assert len(lines) == 0 and lines.take() == []


# ---- the runner's core with real processes --------------------------------------------------


class Sink:
    """Reports, acknowledged at once; ``finished`` is set by the final one."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.finished = asyncio.Event()

    def send(self, event: dict[str, Any]) -> asyncio.Future[None]:
        self.reports.append(event)
        if event["type"] == "finished":
            self.finished.set()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    def texts(self) -> list[str]:
        return [line["text"] for r in self.reports if r["type"] == "logs" for line in r["lines"]]

    def final(self) -> dict[str, Any]:
        (final,) = [r for r in self.reports if r["type"] == "finished"]
        return final


class MemoryTransport:
    kind = "memory"

    def __init__(self) -> None:
        self.reports = Sink()


def _assignment(*argv: str) -> dict[str, Any]:
    return {
        "run_id": "run_0123456789ab",
        "type": "command",
        "status": "claimed",
        "prompt": None,
        "command": list(argv),
        "session_name": None,
        "session_id": None,
        "agent": None,
        "project_dir": None,
        "labels": [],
        "timeout_s": None,
        "idle_timeout_s": None,
        "max_attempts": 1,
        "attempts": 1,
        "priority": 0,
        "runner_id": "rnr_0123456789ab",
    }


async def _run(settings: RunnerSettings, *argv: str) -> Sink:
    transport = MemoryTransport()
    runner = RunnerCore(settings, transport)  # type: ignore[arg-type]  # only its reports are used
    runner.start(_assignment(*argv))
    await asyncio.wait_for(transport.reports.finished.wait(), STEP_S)
    assert runner.attempts == {} and runner.free_slots == settings.slots  # the slot is free
    return transport.reports


SETTINGS = RunnerSettings(slots=1, log_flush_s=0.05)


@pytest.mark.anyio
async def test_an_over_long_line_is_cut_with_a_marker_and_reading_goes_on() -> None:
    script = "head -c 5000 /dev/zero | tr '\\0' x; echo; echo after; head -c 3000 /dev/zero"
    reports = await _run(replace(SETTINGS, max_line_bytes=1000), "sh", "-c", script)
    assert reports.texts() == [
        "x" * 1000 + cut_marker(4000),
        "after",
        "\ufffd" * 1000 + cut_marker(2000),  # no newline at the end: the last line still counts
    ]
    assert reports.final()["status"] == "completed"


@pytest.mark.anyio
async def test_a_line_over_64_mib_without_a_newline_ends_with_a_final_report() -> None:
    size = 65 * 1024 * 1024
    script = f"head -c {size} /dev/zero | tr '\\0' x; echo; echo after"
    reports = await _run(SETTINGS, "sh", "-c", script)
    first, after = reports.texts()
    assert after == "after"
    kept = first.rstrip("]").rsplit(" [corral: ", 1)[0]
    assert set(kept) == {"x"}
    assert first == kept + cut_marker(size - len(kept))
    assert reports.final()["status"] == "completed"


@pytest.mark.anyio
async def test_a_fast_printer_s_output_is_whole_and_in_order() -> None:
    reports = await _run(SETTINGS, "seq", "100000")
    assert reports.texts() == [str(n) for n in range(1, 100_001)]
    numbers = [
        line["line_no"] for r in reports.reports if r["type"] == "logs" for line in r["lines"]
    ]
    assert numbers == list(range(100_000))
    assert all(len(r["lines"]) <= MAX_LOG_LINES for r in reports.reports if r["type"] == "logs")
    assert reports.final()["status"] == "completed"


@pytest.mark.anyio
async def test_each_run_sees_the_allowed_host_environment_and_its_own_env_alone() -> None:
    """The runner matches its environment against the allow-list once (``RunnerCore``
    keeps the result): a run's own ``env`` and identity must not reach the next run, and a
    secret of the runner's reaches none."""
    transport = MemoryTransport()
    host = {"PATH": os.environ["PATH"], "CORRAL_TOKEN": "runner-secret", "LANG": "C.UTF-8"}
    runner = RunnerCore(SETTINGS, transport, host_env=host)  # type: ignore[arg-type]
    seen = []
    for n, env in enumerate([{"ONLY_FIRST": "1", "LANG": "fr_FR.UTF-8"}, {}]):
        transport.reports = Sink()
        runner.start({**_assignment("env"), "run_id": f"run_00000000000{n}", "env": env})
        await asyncio.wait_for(transport.reports.finished.wait(), STEP_S)
        seen.append(dict(line.split("=", 1) for line in transport.reports.texts()))
    first, second = seen
    assert (first["ONLY_FIRST"], first["LANG"], first["CORRAL_RUN_ID"]) == (
        "1",
        "fr_FR.UTF-8",
        "run_000000000000",
    )
    assert "ONLY_FIRST" not in second
    assert (second["LANG"], second["CORRAL_RUN_ID"]) == ("C.UTF-8", "run_000000000001")
    assert not any("CORRAL_TOKEN" in run or "runner-secret" in run.values() for run in seen)
