"""A minimal actor for the end-to-end tests: an HTTP server on ``PORT`` (stdlib only, so it
starts fast) that answers ``GET /hit/<id>`` with ``<id>`` after appending ``<id>`` to the
file ``MARKERS`` names, one line per request it handled: how many times the actor ran each
request, whatever the client saw. ``GET /slow/<id>`` does the same after ``DELAY`` seconds;
``GET /port`` answers its port (the benchmark compares the gateway with going straight there);
``GET /sleep/<id>`` asks its runner to put it to sleep (seed 002's ``GET /sleep``) and
answers; ``GET /held/<id>`` appends ``<id>`` at once, then answers once the file
``<MARKERS>.<id>.go`` exists (a test decides when the answer leaves); ``POST /echo/<id>``
answers the body it was sent. With ``STOP_DELAY`` set it takes that long to exit after
SIGTERM (an actor slow to stop: a wake while it stops is deferred).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    # Connections kept alive, as any real HTTP server keeps them (http.server's default,
    # HTTP/1.0, opens one a request): the runner reuses its connection to the actor.
    protocol_version = "HTTP/1.1"
    # Its head and body go out as two writes: without TCP_NODELAY the body would wait for
    # the head's acknowledgement (Nagle), which the client delays (~40 ms a request).
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        kind, _, request_id = self.path.strip("/").partition("/")
        if kind == "port":
            request_id = os.environ["PORT"]
        elif kind == "sleep":
            from corral import actor  # the runner's local API (only this path needs it)

            actor.sleep()
        elif kind == "slow":
            time.sleep(float(os.environ.get("DELAY", "0.2")))
        if kind not in ("hit", "slow", "port", "sleep", "held") or not request_id:
            self.send_error(404)
            return
        if kind != "port":
            with open(os.environ["MARKERS"], "a") as markers:
                markers.write(f"{request_id}\n")
        if kind == "held":
            go = f"{os.environ['MARKERS']}.{request_id}.go"
            while not os.path.exists(go):
                time.sleep(0.01)
        body = request_id.encode()
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        kind, _, request_id = self.path.strip("/").partition("/")
        if kind != "echo" or not request_id:
            self.send_error(404)
            return
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        with open(os.environ["MARKERS"], "a") as markers:
            markers.write(f"{request_id}\n")
        self.send_response(200)
        self.send_header("content-type", "application/octet-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet: the test reads the markers


def exit_later(*_: object) -> None:
    delay = float(os.environ.get("STOP_DELAY", "0"))
    threading.Thread(target=lambda: (time.sleep(delay), os._exit(0)), daemon=True).start()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, exit_later)
    ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
