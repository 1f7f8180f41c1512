"""A runner written from the seed document alone (seed 001, "Run Execution Flow").

Its parts are the seed's: a poller (``GET /runner/runs?runner_id=…``, long-poll, ``{run}``
or 204), an executor that spawns one process per run, a supervisor that checks the
processes and reports ``completed {runner_id}`` or ``failed {runner_id, error}``, and a
heartbeat sender (``{runner_id}``). It knows nothing of corral's own runner protocol
(no attempts, no ``held``, no batches). The only liberties: a command run's argv is spawned
as it is, an agent run spawns ``$SEED_CLAUDE -p PROMPT`` (the seed spawns ``ao-start``), and
a failed call is retried until the coordinator answers (the seed gives up after three; these
tests kill the coordinator on purpose and want the runner to outlive it), and every call
carries ``CORRAL_TOKEN`` as a bearer token (corral refuses calls without one).

    python seed_runner.py URL NAME   (SEED_CLAUDE: the claude CLI to spawn for agent runs)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import httpx

RETRY_S = 0.2


class Coordinator:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        # Its operator gave it a token, as to any runner (CORRAL_TOKEN of the test's cluster).
        token = os.environ.get("CORRAL_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(timeout=60.0, headers=headers)
        self.lock = threading.Lock()

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Until the coordinator answers (it may be restarting); a 4xx is an answer."""
        while True:
            try:
                response = self.http.request(method, f"{self.url}{path}", **kwargs)
            except httpx.TransportError:
                time.sleep(RETRY_S)
                continue
            if response.status_code < 500:
                return response
            time.sleep(RETRY_S)


class SeedRunner:
    def __init__(self, url: str, name: str) -> None:
        self.api = Coordinator(url)
        self.name = name
        self.runner_id = ""
        self.heartbeat_interval = 1.0
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def register(self) -> None:
        body = {"name": self.name, "hostname": socket.gethostname()}
        data = self.api.call("POST", "/runner/register", json=body).json()
        self.runner_id = data["runner_id"]
        self.heartbeat_interval = float(data.get("heartbeat_interval_s", 1.0))
        print(f"registered {self.runner_id}", flush=True)

    # ---- RunPoller --------------------------------------------------------------------

    def poll_loop(self) -> None:
        while not self.stopping.is_set():
            response = self.api.call("GET", "/runner/runs", params={"runner_id": self.runner_id})
            if response.status_code == 204:
                continue
            response.raise_for_status()
            self.execute(response.json()["run"])

    # ---- RunExecutor ------------------------------------------------------------------

    def execute(self, run: dict[str, Any]) -> None:
        if run["type"] == "command":
            argv = list(run["command"])
        else:
            argv = [os.environ["SEED_CLAUDE"], "-p", run["prompt"], "--output-format", "text"]
        process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=run["project_dir"]
        )
        with self.lock:
            self.running[run["run_id"]] = process
        self.report(run["run_id"], "started", {})

    # ---- RunSupervisor ----------------------------------------------------------------

    def supervise_loop(self) -> None:
        while not self.stopping.is_set():
            with self.lock:
                finished = [(r, p.poll()) for r, p in self.running.items() if p.poll() is not None]
                for run_id, _ in finished:
                    del self.running[run_id]
            for run_id, code in finished:
                if code == 0:
                    self.report(run_id, "completed", {})
                else:
                    self.report(run_id, "failed", {"error": f"Process exited with code {code}"})
            time.sleep(0.1)

    def report(self, run_id: str, what: str, body: dict[str, Any]) -> None:
        response = self.api.call(
            "POST", f"/runner/runs/{run_id}/{what}", json={"runner_id": self.runner_id, **body}
        )
        print(f"{what} {run_id}: {response.status_code}", flush=True)

    # ---- HeartbeatSender --------------------------------------------------------------

    def heartbeat_loop(self) -> None:
        while not self.stopping.wait(self.heartbeat_interval):
            self.api.call("POST", "/runner/heartbeat", json={"runner_id": self.runner_id})


def main() -> None:
    runner = SeedRunner(sys.argv[1], sys.argv[2])
    signal.signal(signal.SIGTERM, lambda *_: runner.stopping.set())
    runner.register()
    loops = [runner.poll_loop, runner.supervise_loop, runner.heartbeat_loop]
    for loop in loops:
        threading.Thread(target=loop, daemon=True).start()
    runner.stopping.wait()


if __name__ == "__main__":
    main()
