"""An agent's stream-json as a transcript: text, tool calls and their results, the end."""

from __future__ import annotations

import json

from corral.cli.transcript import PREVIEW_CHARS, Transcript


def _render(*events: object) -> list[str]:
    transcript = Transcript()
    out: list[str] = []
    for event in events:
        out += transcript.render(event if isinstance(event, str) else json.dumps(event))
    return out


def test_a_tool_using_turn_reads_as_a_transcript() -> None:
    lines = _render(
        {"type": "system", "subtype": "init", "session_id": "s-1", "model": "sonnet"},
        {
            "type": "assistant",
            "message": {
                "content": [
                    {"type": "text", "text": "Reading it."},
                    {"type": "tool_use", "name": "Read", "input": {"file_path": "README.md"}},
                ]
            },
        },
        {
            "type": "user",
            "message": {"content": [{"type": "tool_result", "content": "# corral\nline two"}]},
        },
        {
            "type": "user",
            "message": {"content": [{"type": "tool_result", "content": "no", "is_error": True}]},
        },
        {"type": "stream_event", "event": {}},
        "a line that is not JSON",
        {
            "type": "result",
            "subtype": "success",
            "num_turns": 2,
            "total_cost_usd": 0.0375,
            "duration_ms": 1500,
        },
    )
    assert lines == [
        "── session s-1 · model sonnet",
        "Reading it.",
        '→ Read {"file_path": "README.md"}',
        "  ← # corral line two",
        "  ✗ no",
        "a line that is not JSON",
        "── done · 2 turns · $0.0375 · 1.5s",
    ]


def test_long_tool_input_is_cut_and_error_ends_say_so() -> None:
    long_input = {"command": "x" * 1000}
    (call,) = _render(
        {
            "type": "assistant",
            "message": {"content": [{"type": "tool_use", "name": "Bash", "input": long_input}]},
        }
    )
    assert len(call) == len("→ Bash ") + PREVIEW_CHARS and call.endswith("…")
    assert _render({"type": "result", "subtype": "error_max_turns", "is_error": True}) == [
        "── error_max_turns"
    ]
