"""An actor for tests that makes the ``corral.actor`` calls a request asks for:

GET /                 {"generation": n}
GET /alarm/SECONDS    set an alarm that far ahead, then ask to sleep
GET /stop             ask to stop (intent Stop)
GET /kv/too-big       put a value over the KV limit: {"code": the refusal's code}
"""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from corral import actor
from corral.errors import CorralError


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        parts = self.path.strip("/").split("/")
        answer: dict[str, Any] = {"generation": actor.generation()}
        after: Any = None
        if parts[0] == "alarm":
            actor.set_alarm(time.time() + float(parts[1]))
            after = actor.sleep
        elif parts[0] == "stop":
            after = actor.stop
        elif parts[0] == "input":
            answer["input_bytes"] = len(actor.input().encode())
        elif parts[0] == "kv":
            try:
                actor.kv.put("k", "x" * (128 * 1024 + 1))
            except CorralError as exc:
                answer["code"] = exc.code
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if after is not None:
            after()

    def log_message(self, format: str, *args: Any) -> None:
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", actor.port()), Handler).serve_forever()
