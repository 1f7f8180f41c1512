"""The chaos soak's actor: a counter kept in its KV, and a ledger of what it did.

An HTTP server on ``PORT`` (stdlib only, so it starts fast). ``GET /count/<request>``
reads ``count`` from its KV, writes ``count + 1`` back, appends a line to the ledger
(``ACTOR_LEDGER``) and answers ``<count + 1>``; requests are taken one at a time, so
within one generation every line counts one more than the one before. A KV call that
fails is answered 503 with a JSON body naming its code (and no line is written).

At its start it takes an exclusive lock on ``ACTOR_LOCKS/<actor id>`` without waiting:
the kernel releases it when the process is gone, however it ended (SIGKILL included), so
a generation that finds it held knows another generation of the actor is alive at that
moment and says so in the ledger (then waits for the lock, and goes on).

    start <actor> <generation> <pid> <time>
    overlap <actor> <generation> <pid> <time>       another generation holds the lock
    hit <actor> <generation> <request> <count> <time>
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from corral import actor
from corral.errors import CorralError

LOCK = threading.Lock()  # one request at a time: the KV read and write are not atomic


def note(line: str) -> None:
    with open(os.environ["ACTOR_LEDGER"], "a") as ledger:
        ledger.write(f"{line} {time.time():.6f}\n")


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        kind, _, request_id = self.path.strip("/").partition("/")
        if kind != "count" or not request_id:
            self.send_error(404)
            return
        with LOCK:
            try:
                count = int(actor.kv.get("count") or 0) + 1
                actor.kv.put("count", str(count))
            except CorralError as exc:
                self.answer(503, json.dumps({"code": f"actor_kv_{exc.code}"}))
                return
            except OSError as exc:  # the runner's local API is gone (it is being killed)
                self.answer(503, json.dumps({"code": "actor_kv_unreachable", "error": str(exc)}))
                return
            note(f"hit {actor.actor_id()} {actor.generation()} {request_id} {count}")
        self.answer(200, str(count))

    def answer(self, status: int, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def take_the_lock() -> None:
    path = os.path.join(os.environ["ACTOR_LOCKS"], actor.actor_id())
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # kept open for the process's life
    who = f"{actor.actor_id()} {actor.generation()} {os.getpid()}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        note(f"overlap {who}")
        fcntl.flock(fd, fcntl.LOCK_EX)
    note(f"start {who}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    take_the_lock()
    ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
