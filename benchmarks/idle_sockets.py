"""Idle runner sockets: what one coordinator spends holding N connected, idle runners.

One ``corral serve`` process (SQLite, or PostgreSQL with ``--db postgres``: a schema of its
own on ``CORRAL_TEST_PG``); ``--clients`` worker processes (this script with ``--worker``,
2,500 sockets each by default: one Python process is too slow to keep 10,000 pinging on
time) open N WebSocket connections to ``/runner/socket`` between them and speak the
protocol minimally: a valid ``ToServerInit`` per socket (distinct names), then nothing but a
``ToServerPing`` as often as the answer to its Init asks (3 s by default; frames from the
coordinator are read and dropped). Like the real runner, they ask for no compression and
send no transport-level keepalive pings. A socket that fails to connect is counted, not
fatal. Each process raises its ``RLIMIT_NOFILE`` (the coordinator inherits this one's) to
what N sockets need. Once all are connected and a settling pause is over, it samples the
coordinator's CPU (/proc/<pid>/stat utime+stime) over the measurement window and its RSS
(/proc/<pid>/status VmRSS). Then, with the idle sockets still open, a real ``corral
runner`` (1 slot, a label of its own) joins and runs that need its label are dispatched one
at a time: POST /runs → the run's process has started, p50 and p99 (a new run used to wake
every socket's push loop into a claim; now only the socket it fits: ``coordinator.waiters``).

    python benchmarks/idle_sockets.py [--sockets 1000] [--measure 30] [--settle 10]
                                      [--dispatch-samples 30] [--db sqlite|postgres]
                                      [--clients K] [--batch 50] [--ping-interval S]
                                      [--connect-within S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from dispatch import database, measure_latency, pct
from served import CORRAL, corral_serve
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from corral.protocol import messages as m

TICKS = os.sysconf("SC_CLK_TCK")
SCRIPT = str(Path(__file__).resolve())  # the worker processes run it too
PING_S = 3.0
DISPATCH_WARMUP = 5  # runs dispatched to the real runner before the measured ones
TOKEN = "crl_bench-admin-token"  # CORRAL_TOKEN of the coordinator it starts
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class IdleRunner:
    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.name = name
        self.ws: ClientConnection | None = None
        self.runner_id: str | None = None
        self.pings = 0
        self.ping_s = PING_S  # what the coordinator's Init says (a real runner pings so)
        self.closed: str | None = None  # the close code and reason, if the coordinator closed it
        self.failed: str | None = None  # why it could not connect
        self.life: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        self.ws = await connect(
            self.url,
            open_timeout=60,
            ping_interval=None,
            compression=None,
            additional_headers=AUTH,
        )
        init = m.ToServerInit(
            name=self.name,
            version="idle-bench",
            protocol_version=m.PROTOCOL_VERSION,
            total_slots=1,
            last_command_idx=0,
            runner_id=None,
            labels=(),
            metadata={"hostname": "idle-bench"},
        )
        await self.ws.send(m.encode(init))
        hello = m.decode(await asyncio.wait_for(self.ws.recv(), 60), side="client")
        assert isinstance(hello, m.ToClientInit), hello
        self.runner_id = hello.runner_id
        # As the real runner: within a third of its lease (the lost threshold less its stop
        # margin, its kill grace of 10 s and a second, at most a third of the threshold).
        told = float(hello.metadata.get("ping_interval", PING_S))
        threshold = float(hello.metadata.get("runner_lost_threshold", 20.0))
        self.ping_s = min(told, (threshold - min(11.0, threshold / 3)) / 3)

    async def live(self) -> None:
        """Ping as often as the coordinator asked (first one at a random offset), drop
        whatever comes in."""
        assert self.ws is not None
        ws = self.ws

        async def drop_incoming() -> None:
            async for _ in ws:
                pass

        reader = asyncio.create_task(drop_incoming())
        try:
            await asyncio.sleep(self.ping_s * (hash(self.name) % 1000) / 1000)
            while True:
                await ws.send(m.encode(m.ToServerPing(time.time())))
                self.pings += 1
                await asyncio.sleep(self.ping_s)
        except ConnectionClosed as exc:
            self.closed = (
                f"{exc.rcvd.code if exc.rcvd else '?'} {exc.rcvd.reason if exc.rcvd else ''}"
            )
        finally:
            reader.cancel()


async def open_all(
    url: str, first: int, count: int, batch: int, within_s: float = 0.0
) -> list[IdleRunner]:
    """Connect ``count`` runners, ``batch`` at a time; each pings from its Init on, as a
    real runner does (a socket silent until the last one connected would be declared lost
    when connecting takes longer than the lost threshold). One that fails is counted.
    ``within_s`` (0: no limit): no socket is opened after so many seconds (a coordinator
    that cannot take them all is then measured with what it took)."""
    runners = [IdleRunner(url, f"idle-{i:05d}") for i in range(first, first + count)]
    end = time.monotonic() + within_s if within_s else None
    for offset in range(0, count, batch):
        if end is not None and time.monotonic() > end:
            for runner in runners[offset:]:
                runner.failed = "not tried (--connect-within)"
            break
        group = runners[offset : offset + batch]
        results = await asyncio.gather(*(r.connect() for r in group), return_exceptions=True)
        for runner, result in zip(group, results, strict=True):
            if isinstance(result, BaseException):
                runner.failed = f"{type(result).__name__}: {str(result)[:80]}"
            else:
                runner.life = asyncio.create_task(runner.live())
    return runners


async def worker(url: str, first: int, count: int, batch: int, within_s: float) -> None:
    """One client process: open its sockets, say how it went (a JSON line), keep them
    pinging until its standard input closes, then say how many the coordinator closed."""
    started = time.monotonic()
    runners = await open_all(url, first, count, batch, within_s)
    failed = Counter(r.failed for r in runners if r.failed is not None)
    report(
        ping_s=max(r.ping_s for r in runners),
        connected=sum(r.failed is None for r in runners),
        failed=dict(failed.most_common(3)),
        seconds=time.monotonic() - started,
    )
    loop = asyncio.get_running_loop()
    while await loop.run_in_executor(None, sys.stdin.readline):  # asked: pings sent so far
        report(pings=sum(r.pings for r in runners))
    lives = [r.life for r in runners if r.life is not None]
    for task in lives:
        task.cancel()
    await asyncio.gather(*lives, return_exceptions=True)
    closed = Counter(r.closed for r in runners if r.closed is not None)
    report(closed=sum(closed.values()), reasons=dict(closed.most_common(3)))
    await asyncio.gather(*(r.ws.close() for r in runners if r.ws is not None))


def report(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


class Clients:
    """The worker processes, and what they said."""

    def __init__(self, procs: list[asyncio.subprocess.Process]) -> None:
        self.procs = procs

    @classmethod
    async def start(
        cls, url: str, sockets: int, clients: int, batch: int, within_s: float
    ) -> Clients:
        procs = []
        for k in range(clients):
            first, last = sockets * k // clients, sockets * (k + 1) // clients
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    SCRIPT,
                    "--worker",
                    url,
                    "--first",
                    str(first),
                    "--sockets",
                    str(last - first),
                    "--batch",
                    str(max(1, batch // clients)),
                    "--connect-within",
                    str(within_s),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                )
            )
        return cls(procs)

    async def said(self) -> list[dict[str, Any]]:
        """The next line of each."""
        lines = await asyncio.gather(*(p.stdout.readline() for p in self.procs if p.stdout))
        return [json.loads(line) if line else {} for line in lines]

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.procs)

    async def pings(self) -> int:
        """The pings their sockets have sent so far."""
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.write(b"pings?\n")
        return sum(said.get("pings", 0) for said in await self.said())

    async def stop(self) -> list[dict[str, Any]]:
        for proc in self.procs:
            if proc.stdin is not None:
                proc.stdin.close()
        said = await self.said()
        await asyncio.gather(*(p.wait() for p in self.procs))
        return said


async def bench(args: argparse.Namespace, url: str, pid: int) -> None:
    ws_url = url.replace("http://", "ws://") + "/runner/socket"
    clients = args.clients or max(1, -(-args.sockets // 2500))
    t0 = time.monotonic()
    rss_before = rss_mib(pid)
    cpu_at_start = cpu_seconds(pid)
    workers = await Clients.start(ws_url, args.sockets, clients, args.batch, args.connect_within)
    opened = await workers.said()
    connect_s = max([o.get("seconds", 0.0) for o in opened], default=time.monotonic() - t0)
    connect_cpu = cpu_seconds(pid) - cpu_at_start
    connected = sum(o.get("connected", 0) for o in opened)
    ping_s = max(o.get("ping_s", PING_S) for o in opened)
    failures: Counter[str] = Counter()
    for o in opened:
        failures.update(o.get("failed", {}))
    await asyncio.sleep(args.settle)

    pings0 = await workers.pings()
    cpu0, wall0, ccpu0 = cpu_seconds(pid), time.monotonic(), workers.cpu_seconds()
    samples = []
    while time.monotonic() - wall0 < args.measure:
        await asyncio.sleep(min(5.0, args.measure - (time.monotonic() - wall0)))
        samples.append(rss_mib(pid))
    wall = time.monotonic() - wall0
    cpu = cpu_seconds(pid) - cpu0
    client_cpu = workers.cpu_seconds() - ccpu0
    pings = await workers.pings() - pings0
    load = os.getloadavg()
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=AUTH) as http:
        listed = (await http.get("/runners")).json()["runners"]
    active = sum(r["state"] == "active" for r in listed)

    try:
        dispatch, dispatch_cpu, dispatch_wall = await asyncio.to_thread(
            probe_dispatch, url, pid, args.dispatch_samples
        )
    except (httpx.HTTPError, RuntimeError) as exc:  # a coordinator too busy to answer
        print(f"  dispatch to a real runner failed: {exc!r}")
        dispatch, dispatch_cpu, dispatch_wall = [], 0.0, 0.0
    # What the runs cost beyond holding the idle sockets meanwhile (at the idle rate).
    dispatch_cpu_ms = (
        1000 * (dispatch_cpu - cpu / wall * dispatch_wall) / max(1, len(dispatch) + DISPATCH_WARMUP)
    )
    stopped = await workers.stop()
    closed = sum(s.get("closed", 0) for s in stopped)
    reasons: Counter[str] = Counter()
    for s in stopped:
        reasons.update(s.get("reasons", {}))

    per_socket_kib = (samples[-1] - rss_before) * 1024 / max(1, connected)
    per_socket_us = 1e6 * cpu / wall / max(1, connected)
    print(
        f"\nidle sockets on {os.cpu_count()} cores: one `corral serve` ({args.db}), {args.sockets} "
        f"WebSocket runners pinging every {ping_s:g} s, from {clients} client processes"
    )
    print(
        f"  connect + Init of all sockets    {connect_s:8.1f} s  "
        f"(coordinator CPU {connect_cpu:.1f} s, "
        f"{1000 * connect_cpu / max(1, connected):.1f} ms a socket)"
    )
    print(
        f"  sockets connected                {connected:8d} / {args.sockets}"
        + (f"; failed: {dict(failures.most_common(3))}" if failures else "")
    )
    print(
        f"  coordinator CPU, idle            {100 * cpu / wall:8.1f} % of one core "
        f"({cpu:.2f} s over {wall:.1f} s; {per_socket_us:.1f} µs a socket a second)"
    )
    print(
        f"  coordinator RSS                  {samples[-1]:8.1f} MiB "
        f"(before the sockets {rss_before:.1f} MiB; ~{per_socket_kib:.0f} KiB per socket; "
        f"samples {', '.join(f'{s:.0f}' for s in samples)})"
    )
    print(
        f"  pings sent by the runners        {pings / wall:8.0f} a second "
        f"(coordinator CPU {1e6 * cpu / max(1, pings):.0f} µs a ping, all it did included)"
    )
    print(f"  client CPU (the workers)         {100 * client_cpu / wall:8.1f} % of one core")
    print(
        f"  runners active in the store      {active:8d} / {args.sockets}; "
        f"sockets closed by the coordinator: {closed}"
        + (f" {dict(reasons.most_common(3))}" if reasons else "")
    )
    if dispatch:
        print(
            f"  dispatch to a real runner        {pct(dispatch, 50):8.1f} ms p50, "
            f"{pct(dispatch, 99):.1f} ms p99 ({len(dispatch)} runs, one at a time); "
            f"coordinator CPU {dispatch_cpu_ms:.1f} ms per run dispatched (beyond the idle rate)"
        )
    print(
        f"  load average (1, 5, 15 min)      {load[0]:8.1f} {load[1]:.1f} {load[2]:.1f} "
        "(at the end of the idle window)"
    )


def probe_dispatch(
    url: str, pid: int, samples: int, warmup: int = DISPATCH_WARMUP
) -> tuple[list[float], float, float]:
    """POST /runs → the run's process started (ms), to a real runner beside the idle ones;
    the coordinator's CPU and the wall time those runs took (s)."""
    if samples <= 0:
        return [], 0.0, 0.0
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_URL=url, CORRAL_TOKEN=TOKEN)
    runner = subprocess.Popen(
        [CORRAL, "runner", "--name", "probe", "--slots", "1", "--labels", "probe"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        with httpx.Client(base_url=url, timeout=60, headers=AUTH) as client:
            end = time.monotonic() + 60
            while not any(
                r["name"] == "probe" and r["state"] == "active"
                for r in client.get("/runners").json()["runners"]
            ):
                if time.monotonic() > end:
                    raise RuntimeError("the probe runner did not register")
                time.sleep(0.5)  # each look lists every idle runner too
        cpu0, wall0 = cpu_seconds(pid), time.monotonic()
        latencies = measure_latency(url, samples, warmup, labels=["probe"])
        return latencies, cpu_seconds(pid) - cpu0, time.monotonic() - wall0
    finally:
        os.killpg(runner.pid, signal.SIGTERM)
        runner.wait(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sockets", type=int, default=1000)
    parser.add_argument("--measure", type=float, default=30.0, help="seconds of measurement")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds before measuring")
    parser.add_argument("--batch", type=int, default=50, help="sockets opened at once")
    parser.add_argument(
        "--clients", type=int, default=0, help="client processes (0: one per 2,500 sockets)"
    )
    parser.add_argument(
        "--dispatch-samples", type=int, default=30, help="runs dispatched to a real runner"
    )
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument(
        "--ping-interval", type=float, help="the coordinator's --ping-interval (its default)"
    )
    parser.add_argument(
        "--connect-within",
        type=float,
        default=0.0,
        help="open no socket after this many seconds, measure what connected (0: no limit)",
    )
    parser.add_argument("--worker", metavar="WS_URL", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, max(soft, args.sockets + 1024))
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))  # inherited by the coordinator
    if args.worker:
        asyncio.run(worker(args.worker, args.first, args.sockets, args.batch, args.connect_within))
        return

    env = {"CORRAL_TOKEN": TOKEN}
    if args.ping_interval is not None:
        env["CORRAL_PING_INTERVAL"] = str(args.ping_interval)
    with (
        tempfile.TemporaryDirectory() as tmp,
        database(args.db, Path(tmp)) as db,
        corral_serve(db if args.db == "postgres" else "idle.db", env) as (url, pid),
    ):
        asyncio.run(bench(args, url, pid))


if __name__ == "__main__":
    main()
