"""An agent actor: one per issue or chat thread (its key), holding a Claude session.

Each ``POST /message`` (the body is the message) resumes the thread's Claude session — its
id kept in the actor's KV, so it survives sleeping — and answers with the agent's reply.
``GET /`` shows the actor and its session; ``GET /sleep`` answers, then asks to sleep.
The runner puts it to sleep after ``sleep_after`` idle seconds; the next request (through
the gateway) wakes it with a new generation, and the session goes on.

    [actors.agent]                       # in the runner's corral.toml
    command = ["python", "examples/agent_actor.py"]
    sleep_after = 300
    env = { CLAUDE_BIN = "claude" }

    corral actors create agent --key issue-12
"""

from __future__ import annotations

import json
import os
import subprocess
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from corral import actor

SESSION = "session_id"


def ask(message: str) -> dict[str, Any]:
    """Resume the thread's session (or start it) with ``message``; remember its id."""
    argv = [os.environ.get("CLAUDE_BIN", "claude"), "-p", message, "--output-format", "json"]
    session_id = actor.kv.get(SESSION)
    if session_id:
        argv += ["--resume", session_id]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip() or f"exit {done.returncode}"}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    actor.kv.put(SESSION, result["session_id"])
    return {"session_id": result["session_id"], "reply": result.get("result")}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        actor.activity()
        about = {
            "actor_id": actor.actor_id(),
            "key": actor.key(),
            "generation": actor.generation(),
            "session_id": actor.kv.get(SESSION),
        }
        self._answer(200, about)
        if self.path == "/sleep":
            actor.sleep()

    def do_POST(self) -> None:
        actor.activity()
        length = int(self.headers.get("content-length") or 0)
        message = self.rfile.read(length).decode()
        answer = ask(message)
        answer["generation"] = actor.generation()
        self._answer(500 if "error" in answer else 200, answer)

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the runner logs what the actor prints: keep it to what matters


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", actor.port()), Handler)
    server.serve_forever()
