"""Open long-polls: what N waiting runners cost everyone else, as ``GET /runs`` latency.

One ``corral serve`` process (SQLite, the default 30 s poll timeout); this process
registers N long-poll runners and keeps one ``GET /runner/runs`` open for each (polling
again as soon as one answers, like the runner). The store holds runs to list: finished
ones, and pending ones that no runner can take (they need a label none has) — so the
coordinator's reconciler finds claimable-looking work every second, the case where every
waiting poll used to wake into a write transaction. It measures ``GET /runs`` latency
(sequential requests) first with no poll open, then with all N open, and prints the
median and 95th percentile of each and their ratio (goal: under 2x).

    python benchmarks/long_polls.py [--polls 2000] [--samples 200] [--settle 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time

import httpx
from served import corral_serve

TOKEN = "long-polls-benchmark"  # for a coordinator that asks for one (CORRAL_TOKEN)


async def latencies(http: httpx.AsyncClient, samples: int) -> list[float]:
    found = []
    for _ in range(samples):
        t0 = time.perf_counter()
        response = await http.get("/runs", params={"limit": 50})
        found.append(time.perf_counter() - t0)
        assert response.status_code == 200, response.text
    return found


async def keep_polling(http: httpx.AsyncClient, runner_id: str, answers: list[int]) -> None:
    while True:
        response = await http.get(
            "/runner/runs", params={"runner_id": runner_id, "max_runs": 1}, timeout=120
        )
        answers.append(response.status_code)


def summary(name: str, values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    return f"  GET /runs {name:<26} median {statistics.median(ms):8.2f} ms   p95 {p95:8.2f} ms"


async def bench(args: argparse.Namespace, url: str) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    limits = httpx.Limits(max_connections=args.polls + 50, max_keepalive_connections=args.polls)
    async with (
        httpx.AsyncClient(base_url=url, timeout=60, headers=headers) as http,
        httpx.AsyncClient(base_url=url, timeout=60, headers=headers, limits=limits) as polls,
    ):
        runs = [{"type": "command", "command": ["true"]} for _ in range(100)]
        created = (await http.post("/runs:batch", json={"runs": runs})).json()["runs"]
        for run in created:  # nobody runs them: cancelled, they are finished runs to list
            await http.post(f"/runs/{run['run_id']}/cancel")
        stuck = [{"type": "command", "command": ["true"], "labels": ["nobody"]}] * 20
        assert (await http.post("/runs:batch", json={"runs": stuck})).status_code == 201

        await latencies(http, 20)  # warm up
        idle = await latencies(http, args.samples)

        runner_ids = []
        for i in range(args.polls):
            body = {"name": f"poller-{i:05d}", "hostname": "bench", "slots": 1}
            response = await http.post("/runner/register", json=body)
            assert response.status_code == 200, response.text
            runner_ids.append(response.json()["runner_id"])
        answers: list[int] = []
        pollers = [asyncio.create_task(keep_polling(polls, r, answers)) for r in runner_ids]
        await asyncio.sleep(args.settle)
        busy = await latencies(http, args.samples)
        open_polls = sum(not p.done() for p in pollers)
        for poller in pollers:
            poller.cancel()
        await asyncio.gather(*pollers, return_exceptions=True)

    ratio = statistics.median(busy) / statistics.median(idle)
    print(f"\nlong-polls on {os.cpu_count()} cores: one `corral serve` (SQLite)")
    print(summary("idle", idle))
    print(summary(f"with {args.polls} polls open", busy))
    print(f"  ratio of the medians                 {ratio:8.2f}x (goal: under 2x)")
    print(f"  polls open while measuring           {open_polls:8d} / {args.polls}")
    print(f"  poll answers meanwhile               {len(answers):8d} {sorted(set(answers))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--polls", type=int, default=2000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before measuring")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, max(soft, 2 * args.polls + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))  # inherited by the coordinator

    with corral_serve("polls.db", {"CORRAL_TOKEN": TOKEN}) as (url, _):
        asyncio.run(bench(args, url))


if __name__ == "__main__":
    main()
