"""An agent run's stream-json output (Claude Code's ``--output-format stream-json``) as a
transcript a person reads: what the agent said, the tools it called, how it ended.

A line that is not one of the agent's JSON events is shown as it is; ``logs --raw``
shows every line as it is.
"""

from __future__ import annotations

import json
from typing import Any

from corral.cli.output import money

PREVIEW_CHARS = 200  # a tool call's input or result: its start is enough to follow along


class Transcript:
    """Turns one output line at a time into the lines to show (none for noise)."""

    def render(self, line: str) -> list[str]:
        try:
            event = json.loads(line)
        except ValueError:
            return [line]
        if not isinstance(event, dict) or "type" not in event:
            return [line]
        kind = event["type"]
        if kind == "system" and event.get("subtype") == "init":
            return [f"── session {event.get('session_id', '?')} · model {event.get('model', '?')}"]
        if kind in ("assistant", "user"):
            return _message(kind, event.get("message") or {})
        if kind == "result":
            return [_result(event)]
        return []  # other events (hooks, status) say nothing a reader needs


def _message(kind: str, message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [f"{kind}: {content}"] if kind == "assistant" else []
    out: list[str] = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and kind == "assistant":
            out.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            args = json.dumps(block.get("input", {}), ensure_ascii=False)
            out.append(f"→ {block.get('name', '?')} {_preview(args)}")
        elif block.get("type") == "tool_result":
            mark = "✗" if block.get("is_error") else "←"
            out.append(f"  {mark} {_preview(_text_of(block.get('content')))}")
    return out


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
    return str(content or "")


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"


def _result(event: dict[str, Any]) -> str:
    outcome = "error" if event.get("is_error") else "done"
    if event.get("subtype") not in (None, "success"):
        outcome = str(event["subtype"])
    parts = [f"── {outcome}"]
    if event.get("num_turns") is not None:
        parts.append(f"{event['num_turns']} turns")
    if isinstance(event.get("total_cost_usd"), int | float):
        parts.append(money(float(event["total_cost_usd"])))
    if isinstance(event.get("duration_ms"), int | float):
        parts.append(f"{event['duration_ms'] / 1000:.1f}s")
    return " · ".join(parts)
