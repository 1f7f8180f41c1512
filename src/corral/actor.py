"""For actor authors: the actor's identity and its runner's local API, in a few calls.

    from corral import actor

    session = actor.kv.get("session_id")        # durable state, kept across sleeps
    actor.kv.put("session_id", "abc")
    actor.set_alarm(time.time() + 3600)          # be woken then, even if asleep
    actor.sleep()                                # idle: stop me; a request wakes me again

The runner starts the process with ``PORT`` (listen there), ``CORRAL_ACTOR_ID``,
``CORRAL_ACTOR_KEY``, ``CORRAL_ACTOR_GENERATION``, ``CORRAL_ACTOR_INPUT`` (or
``CORRAL_ACTOR_INPUT_FILE``) and ``CORRAL_ACTOR_API``; this module reads them. It uses the
standard library only and blocks: call it from a thread in an async server.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from corral.errors import CorralError

TIMEOUT_S = 60.0  # a KV call waits for the runner's link to come back, within reason


def _env(name: str) -> str:
    try:
        return os.environ[name]
    except KeyError:
        raise RuntimeError(
            f"{name} is not set: is this process started by a corral runner?"
        ) from None


def actor_id() -> str:
    return _env("CORRAL_ACTOR_ID")


def key() -> str:
    return os.environ.get("CORRAL_ACTOR_KEY", "")


def generation() -> int:
    return int(_env("CORRAL_ACTOR_GENERATION"))


def port() -> int:
    return int(_env("PORT"))


def input() -> str:
    """The input the actor was created with ('' if none)."""
    path = os.environ.get("CORRAL_ACTOR_INPUT_FILE")
    if path:
        with open(path, encoding="utf-8") as source:
            return source.read()
    return os.environ.get("CORRAL_ACTOR_INPUT", "")


def _call(call: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{_env('CORRAL_ACTOR_API')}/{call}",
        data=json.dumps(body or {}).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            answer: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            refused = json.loads(exc.read())
        except ValueError:
            refused = {}
        code = str(refused.get("code", f"http_{exc.code}"))
        raise CorralError(str(refused.get("error", code)), code=code) from None
    return answer


def sleep() -> None:
    """Intent Sleep: the runner stops this process soon; a request or an alarm wakes the
    actor again (a new generation, same KV)."""
    _call("sleep")


def stop() -> None:
    """Intent Stop: the actor is done. Exiting 0 after this destroys it (and its KV)."""
    _call("stop")


def set_alarm(at: float | None) -> None:
    """Be woken at ``at`` (epoch seconds) if asleep then; None clears the alarm."""
    _call("alarm", {"at": at})


def activity() -> None:
    """Count as a request: the runner's idle timer (``sleep_after``) starts over."""
    _call("activity")


class _Kv:
    """The actor's durable key-value state (string keys and values; see ``store/kv.py``
    for the limits: keys ≤ 2 KiB, values ≤ 128 KiB, ≤ 128 keys a call)."""

    def get(self, key: str) -> str | None:
        return self.get_many([key])[0]

    def get_many(self, keys: list[str]) -> list[str | None]:
        values: list[str | None] = _call("kv", {"op": "get", "keys": keys})["values"]
        return values

    def put(self, key: str, value: str) -> None:
        self.put_many({key: value})

    def put_many(self, entries: dict[str, str]) -> None:
        _call("kv", {"op": "put", "entries": entries})

    def delete(self, *keys: str) -> int:
        return int(_call("kv", {"op": "delete", "keys": list(keys)})["deleted"])

    def list(
        self, prefix: str = "", *, after: str | None = None, limit: int = 100
    ) -> list[tuple[str, str]]:
        body: dict[str, Any] = {"op": "list", "prefix": prefix, "limit": limit}
        if after is not None:
            body["after"] = after
        return [(k, v) for k, v in _call("kv", body)["entries"]]


kv = _Kv()
