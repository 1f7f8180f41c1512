"""Seed 002 end to end, step by step: a sleeping actor on an empty serverless pool, woken
by a request through the gateway, with real processes — ``corral serve``, ``corral
serverless-endpoint`` (whose runners the coordinator's autoscaler starts) and the actor.

    sleeping, no runner ──GET──▶ pending ─▶ desired 1 ─▶ /start ─▶ runner ─▶ running ─▶ 200
    a second request to the running actor ─▶ 200, same generation and runner
    the actor's sleep intent ─▶ sleeping (still placed while it stops, slowly)
    a request meanwhile ─▶ the wake is deferred ─▶ stopped ─▶ placed again ─▶ 200
    the stream's lifespan ends ─▶ drain ─▶ the actor leaves ─▶ a request wakes it on a
    second runner ─▶ 200
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import httpx
from e2e_support import CORRAL, TOKEN, Cluster, Proc, free_port, wait_until

ACTOR = Path(__file__).with_name("counter_actor.py")
LIFESPAN_S = 25.0
DRAIN_GRACE_S = 3.0


def start_endpoint(cluster: Cluster, tmp_path: Path, markers: Path) -> str:
    config = tmp_path / "actors.toml"
    config.write_text(
        "[actors.counter]\n"
        f'command = ["{sys.executable}", "{ACTOR}"]\n'
        f'env = {{ MARKERS = "{markers}", STOP_DELAY = "2" }}\n'
    )
    port = free_port()
    argv = [CORRAL, "serverless-endpoint", "--port", str(port), "--config", str(config),
            "--drain-grace", str(DRAIN_GRACE_S)]  # fmt: skip
    endpoint = Proc("endpoint", argv, cluster.env, cluster.root)
    cluster.procs.append(endpoint)
    endpoint.start()
    url = f"http://127.0.0.1:{port}"

    def listening() -> bool:
        try:
            return httpx.get(f"{url}/nothing", timeout=1).status_code == 404
        except httpx.TransportError:
            return False

    wait_until(listening, 30, what="the endpoint")
    return url


def test_seed_002_a_sleeping_actor_on_a_serverless_pool(cluster: Cluster, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.touch()
    cluster.start_coordinator()
    endpoint = start_endpoint(cluster, tmp_path, markers)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=cluster.url, headers=headers, timeout=60) as http:

        def actor() -> dict[str, Any]:
            found: dict[str, Any] = http.get(f"/actors/{actor_id}").json()
            return found

        def pool() -> dict[str, Any]:
            found: dict[str, Any] = http.get("/pools/sl").json()
            return found

        def live_runners() -> list[str]:
            return [
                r["runner_id"] for r in pool()["runners"] if r["runner_id"] and not r["closing"]
            ]

        config = {"url": endpoint, "request_lifespan": LIFESPAN_S, "max_runners": 2}
        assert http.put("/pools/sl", json={"serverless": config}).status_code == 200

        # An actor created and put to sleep: with nothing wanted, the pool has no runner.
        created = http.post("/actors", json={"name": "counter", "key": "seed", "pool": "sl"})
        assert created.status_code == 201, created.text
        actor_id = created.json()["actor_id"]
        wait_until(lambda: actor()["state"] == "running", 30, what="the actor's first start")
        first_runner = actor()["runner_id"]
        assert http.post(f"/actors/{actor_id}/sleep").status_code == 200
        wait_until(lambda: actor()["state"] == "sleeping" and actor()["runner_id"] is None, 30,
                   what="the actor asleep")  # fmt: skip
        wait_until(lambda: not pool()["runners"], 30, what="the pool empty")
        assert (pool()["wanted_slots"], pool()["desired_runners"]) == (0, 0)
        asleep = actor()

        # critical: request to sleeping actor → pending → desired 1 → /start → running → answer
        answered: list[httpx.Response] = []

        def request(path: str) -> threading.Thread:
            thread = threading.Thread(target=lambda: answered.append(http.get(path)))
            thread.start()
            return thread

        one = request(f"/gateway/{actor_id}/hit/one")
        wait_until(lambda: actor()["state"] == "pending", 10, what="the actor pending, no runner")
        wait_until(lambda: pool()["desired_runners"] == 1, 10, what="desired 1")
        one.join(60)
        assert (answered[0].status_code, answered[0].text) == (200, "one")
        woken = actor()
        assert woken["state"] == "running" and woken["generation"] == asleep["generation"] + 1
        runner = woken["runner_id"]
        assert runner not in (None, first_runner)
        assert woken["connectable_at"] is not None
        assert (pool()["wanted_slots"], pool()["desired_runners"]) == (1, 1)
        assert live_runners() == [runner]

        # critical: request to running actor → answered by the same generation, same runner
        assert http.get(f"/gateway/{actor_id}/hit/two").text == "two"
        assert (actor()["generation"], actor()["runner_id"]) == (woken["generation"], runner)

        # critical: actor sleep (its own intent), and a request while it is stopping (2 s)
        assert http.get(f"/gateway/{actor_id}/sleep/x").status_code == 200
        wait_until(lambda: actor()["state"] == "sleeping", 10, what="the sleep intent applied")
        stopping = actor()
        assert stopping["runner_id"] == runner  # placed until it has stopped
        answered: list[httpx.Response] = []
        late = threading.Thread(
            target=lambda: answered.append(http.get(f"/gateway/{actor_id}/hit/three"))
        )
        late.start()
        wait_until(lambda: actor()["will_wake"], 10, what="the wake deferred")
        late.join(60)
        assert (answered[0].status_code, answered[0].text) == (200, "three")
        again = actor()
        assert again["state"] == "running" and again["generation"] == woken["generation"] + 1

        # critical: the stream's lifespan ends → drain → the actor goes → woken on a second runner
        wait_until(lambda: actor()["runner_id"] != runner, LIFESPAN_S + 30,
                   what="the first runner's drain")  # fmt: skip
        response = http.get(f"/gateway/{actor_id}/hit/four")
        assert (response.status_code, response.text) == (200, "four")
        moved = actor()
        assert moved["state"] == "running" and moved["runner_id"] not in (
            None,
            runner,
            first_runner,
        )
        assert moved["generation"] > again["generation"]
        assert pool()["errors"] == []
        ran = markers.read_text().split()
        assert [m for m in ran if m in ("one", "two", "three", "four")] == [
            "one",
            "two",
            "three",
            "four",
        ]
