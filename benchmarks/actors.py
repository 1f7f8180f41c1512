"""Actors benchmark: a real coordinator, a runner hosting a small HTTP actor, and the gateway.

Measures, on SQLite:
  process start  the actor's own start: its command spawned → its PORT accepts a connection
                 → the first byte of its first answer (what no gateway can make faster),
                 p50/p99, measured before each cold wake
  cold wake      a sleeping actor → the first byte of its answer through the gateway
                 (wake, placement, start command, process start, running, tunnel), p50/p99;
                 its overhead is this less the process start
  warm           requests to a running actor through gateway + tunnel, against the same
                 requests straight to its port: p50/p99 one at a time, and requests/s with
                 --concurrency clients; and the CPU the coordinator and the runner spend per
                 warm request (steadier than times on a loaded machine)

    python benchmarks/actors.py [--cold 20] [--warm 2000] [--concurrency 8] [--profile DIR]

--profile DIR samples the coordinator and the runner with py-spy (``pip install py-spy``)
during the warm requests through the gateway: DIR/coordinator.txt and DIR/runner.txt, in
py-spy's collapsed-stack format.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx

CORRAL = str(Path(sys.executable).parent / "corral")
ACTOR = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "counter_actor.py"
TOKEN = "crl_bench-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepts(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def percentiles(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p50 = statistics.median(ms)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return f"p50 {p50:7.2f} ms   p99 {p99:7.2f} ms   (n={len(ms)})"


def wait(predicate: object, timeout: float = 30.0, what: str = "", every: float = 0.002) -> None:
    end = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every)


def process_start(workdir: Path) -> float:
    """The actor's command alone: spawn → its port accepts → the first byte of its first
    answer (a first request costs an actor more than later ones: lazy imports)."""
    port = free_port()
    env = {**os.environ, "PORT": str(port), "MARKERS": str(workdir / "markers")}
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(ACTOR)], env=env)
    try:
        wait(lambda: accepts(port), what="the actor's port", every=0.001)
        # A bare request (an httpx client would add its own setup to the actor's start).
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"GET /hit/start HTTP/1.1\r\nhost: actor\r\nconnection: close\r\n\r\n")
            conn.recv(1)
            elapsed = time.perf_counter() - started
            while conn.recv(65536):  # the rest, until it closes (not cut off mid-answer)
                pass
        return elapsed
    finally:
        proc.terminate()
        proc.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def sampled(pids: dict[str, int], profile: Path | None) -> Iterator[None]:
    """py-spy on each process while the block runs (nothing without ``profile``)."""
    if profile is None:
        yield
        return
    profile.mkdir(parents=True, exist_ok=True)
    spies = [
        subprocess.Popen(
            [
                str(Path(sys.executable).parent / "py-spy"),
                "record",
                "--pid",
                str(pid),
                "--rate",
                "400",
                "--format",
                "raw",
                "--nonblocking",
                "-o",
                str(profile / f"{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            spy.wait(30)


@contextmanager
def cluster(
    workdir: Path, *, db: str | None = None, actor_slots: int = 16
) -> Iterator[tuple[str, dict[str, int]]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_TOKEN"] = TOKEN
    config = workdir / "actors.toml"
    config.write_text(
        f'[actors.counter]\ncommand = ["{sys.executable}", "{ACTOR}"]\n'
        f'env = {{ MARKERS = "{workdir / "markers"}" }}\n'
    )
    procs = []
    log = open(workdir / "cluster.log", "wb")  # noqa: SIM115 - closed below
    try:
        procs.append(
            subprocess.Popen(
                [CORRAL, "serve", "--port", str(port), "--db", db or str(workdir / "c.db")],
                env=env,
                stdout=log,
                stderr=log,
                cwd=workdir,
                start_new_session=True,
            )
        )
        wait(lambda: _healthy(url), what="the coordinator")
        procs.append(
            subprocess.Popen(
                [
                    CORRAL,
                    "runner",
                    "--url",
                    url,
                    "--name",
                    "bench",
                    "--transport",
                    "websocket",
                    "--config",
                    str(config),
                    "--actor-slots",
                    str(actor_slots),
                ],
                env=env,
                stdout=log,
                stderr=log,
                cwd=workdir,
                start_new_session=True,
            )
        )
        yield url, {"coordinator": procs[0].pid, "runner": procs[1].pid}
    finally:
        for proc in procs:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(30)
        log.close()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _runner_active(http: httpx.Client) -> bool:
    return any(r["state"] == "active" for r in http.get("/runners").json()["runners"])


def actor_state(http: httpx.Client, actor_id: str) -> str:
    return str(http.get(f"/actors/{actor_id}").json()["state"])


def cold_wakes(
    http: httpx.Client, actor_id: str, samples: int, workdir: Path
) -> tuple[list[float], list[float]]:
    """Cold wakes, each after a start of the actor's process alone (interleaved: on a
    loaded machine the two drift together), as (process starts, wakes)."""
    starts, times = [], []
    for i in range(samples):
        starts.append(process_start(workdir))
        http.post(f"/actors/{actor_id}/sleep").raise_for_status()
        wait(lambda: actor_state(http, actor_id) == "sleeping" and
             http.get(f"/actors/{actor_id}").json()["runner_id"] is None,
             what="the actor asleep")  # fmt: skip
        started = time.perf_counter()
        with http.stream("GET", f"/gateway/{actor_id}/hit/cold{i}") as response:
            next(response.iter_raw())
            times.append(time.perf_counter() - started)
    return starts, times


def warm(http: httpx.Client, url: str, count: int) -> list[float]:
    times = []
    with httpx.Client(base_url=url, headers=AUTH) as client:
        for i in range(count):
            started = time.perf_counter()
            client.get(f"/hit/w{i}").raise_for_status()
            times.append(time.perf_counter() - started)
    return times


async def rate(url: str, count: int, concurrency: int) -> float:
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60) as client:
        queue = iter(range(count))

        async def worker() -> None:
            for i in queue:
                (await client.get(f"/hit/r{i}")).raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cold", type=int, default=20)
    parser.add_argument("--warm", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--profile", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        with (
            cluster(workdir) as (url, pids),
            httpx.Client(base_url=url, headers=AUTH, timeout=60) as http,
        ):
            wait(lambda: _runner_active(http), what="the runner")
            created = http.post("/actors", json={"name": "counter", "key": "bench"})
            created.raise_for_status()
            actor_id = created.json()["actor_id"]
            wait(lambda: actor_state(http, actor_id) == "running", what="the actor running")
            starts, wakes = cold_wakes(http, actor_id, args.cold, workdir)
            print("process start   ", percentiles(starts))
            print("cold wake       ", percentiles(wakes))
            overheads = [wake - start for start, wake in zip(starts, wakes, strict=True)]
            print("cold overhead   ", percentiles(overheads), "(each wake less the start before)")
            http.get(f"/gateway/{actor_id}/hit/warmup").raise_for_status()
            gateway = f"{url}/gateway/{actor_id}"
            port = int(http.get(f"/gateway/{actor_id}/port").text)
            direct = f"http://127.0.0.1:{port}"
            with sampled(pids, args.profile):
                cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                print("warm gateway    ", percentiles(warm(http, gateway, args.warm)))
                for name, pid in pids.items():
                    per_request = (cpu_seconds(pid) - cpu_before[name]) / args.warm
                    print(f"cpu {name:12s} {per_request * 1000:7.2f} ms a warm request")
            print("warm direct     ", percentiles(warm(http, direct, args.warm)))
            for name, target in (("gateway", gateway), ("direct", direct)):
                per_s = asyncio.run(rate(target, args.warm, args.concurrency))
                print(f"rate {name:10s} {per_s:8.0f} requests/s ({args.concurrency} clients)")


if __name__ == "__main__":
    main()
