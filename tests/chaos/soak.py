"""The chaos soak: two coordinators and four runners on one PostgreSQL, under fire.

    coordinator A ──┐                 ┌── proxy ◀── runner ws-1 (WebSocket)
                    ├── PostgreSQL ───┤   …         runner ws-2 (WebSocket)
    coordinator B ──┘   (its own)     └── proxy ◀── runner poll-1, poll-2 (long-poll)

Each runner reaches both coordinators (``--coordinator A,B``) through fault proxies of its
own. A workload thread creates runs through either coordinator: commands (short, long,
failing, cancelled while they run) and fake Claude agent sessions, each writing the
ledger (``chaos_ledger.py``). Actors live on the WebSocket runners (long-poll runners
host none): a counter in KV each (``chaos_actor.py``), sent requests through the gateway
of either coordinator by threads of their own, and checked with their own ledger
(``actor_ledger.py``). Meanwhile a chaos thread, at random instants: SIGKILLs a
runner or a coordinator and starts it again after a while, restarts PostgreSQL (a fast
shutdown or an immediate one, as in a crash, then down for a while), cuts one link, or
cuts a runner off from both coordinators (briefly, or longer than its lease).

A round is some seconds of that, then calm: every fault healed, every process up, every
run given time to end; then the ledger is checked (``chaos_ledger.check``). The CI test
runs two short rounds (``test_chaos_soak.py``); the long soak runs as a script and
prints its figures:

    python tests/chaos/soak.py --minutes 30 [--seed N] [--round-s 60]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
import psycopg
from actor_ledger import ActorRequest, ActorVerdict, check_actors, read_ledger
from chaos_ledger import (
    COMMAND_SCRIPT,
    Disruption,
    Entry,
    Job,
    Verdict,
    check,
    job_key,
    read_entries,
)
from e2e_support import TERMINAL, TOKEN, Cluster, Coordinator, JsonClient, Runner, free_port
from faultproxy import CUT_MODES, FaultProxy
from pg_cluster import PgCluster
from tasks_helpers import TaskRepo

from corral.errors import Conflict, CorralError, InvalidRequest

# The coordinators declare a runner lost after this long without news of it: a runner cut
# off for longer loses its runs, which start again elsewhere as new attempts.
LOST_AFTER_S = 5.0
# PostgreSQL outages this close count as one: the coordinators' pools take a moment to
# reconnect, and the runners' reports to get answers again.
PG_OUTAGES_APART_S = 2.0
# A PostgreSQL outage this long may cost runners their leases (see ``_restart_postgres``).
PG_OUTAGE_CUTS_OFF_S = 1.0
SLOTS = 3
MAX_ATTEMPTS = 20  # no run must fail for want of attempts, however often it is lost
SETTLE_TIMEOUT_S = 120.0
RUNNERS = (("ws-1", "websocket"), ("ws-2", "websocket"), ("poll-1", "poll"), ("poll-2", "poll"))
# What the workload creates, with weights: (kind, weight).
TASK_FINAL = frozenset({"completed", "failed", "merge_conflict", "blocked_by_failure", "cancelled"})
KINDS = (("short", 8), ("long", 3), ("fail", 2), ("agent", 5), ("cancel", 2))
ACTORS = 4  # counters on the WebSocket runners, restarted wherever they crash or are lost
ACTOR_KIND = "chaoscounter"
ACTOR_SCRIPT = Path(__file__).with_name("chaos_actor.py")
ACTOR_SENDERS = 2  # threads sending requests to the actors, one at a time each
ACTOR_TIMEOUT_S = 60.0  # a request the gateway leaves without an answer this long: a hang


@dataclass
class Figures:
    started: float = field(default_factory=time.monotonic)
    rounds: int = 0
    coordinator_kills: int = 0
    runner_kills: int = 0
    postgres_restarts: int = 0
    link_cuts: int = 0
    runner_cutoffs: int = 0  # a runner cut off from both coordinators
    long_cutoffs: int = 0  # … for longer than the lost-runner threshold
    unplanned_exits: Counter[str] = field(default_factory=Counter)
    created: Counter[str] = field(default_factory=Counter)
    creation_retries: int = 0  # a create sent again, with its key, after an error
    # Each round's calm: (seconds until every process was up again, then until every
    # run was final).
    calm_s: list[tuple[float, float]] = field(default_factory=list)
    last_open: list[str] = field(default_factory=list)  # the runs and tasks that ended last
    backoff_wait_s: float = 0.0  # the calms' waits for actors' restart backoffs
    verdict: Verdict = field(default_factory=Verdict)
    actors: ActorVerdict = field(default_factory=ActorVerdict)

    @property
    def violations(self) -> list[str]:
        return self.verdict.violations + self.actors.violations

    def line(self) -> str:
        minutes = (time.monotonic() - self.started) / 60
        final = ", ".join(f"{s} {n}" for s, n in sorted(self.verdict.final.items()))
        exits = ", ".join(f"{n} {c}" for n, c in sorted(self.unplanned_exits.items()))
        up, settle = self.calm_s[-1] if self.calm_s else (0.0, 0.0)
        return (
            f"{minutes:.1f} min, {self.rounds} rounds: kills {self.coordinator_kills} "
            f"coordinator + {self.runner_kills} runner, PostgreSQL restarts "
            f"{self.postgres_restarts}, link cuts {self.link_cuts}, runners cut off "
            f"{self.runner_cutoffs} ({self.long_cutoffs} past their lease); runs "
            f"{sum(self.created.values())} ({final}), creates sent again "
            f"{self.creation_retries}, started again after a lost lease "
            f"{self.verdict.reexecuted}; actors {ACTORS}: requests "
            f"{sum(self.actors.answers.values())} ({self.actor_answers()}), generations "
            f"{self.actors.generations} (calms waited {self.backoff_wait_s:.0f}s for "
            f"restart backoffs); unplanned exits {exits or 'none'}; "
            f"last calm: up in {up:.1f}s, runs final {settle:.1f}s later; "
            f"violations {len(self.violations)}"
        )

    def actor_answers(self) -> str:
        return ", ".join(f"{what} {n}" for what, n in self.actors.answers.most_common())


class Soak:
    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.figures = Figures()
        self.pg = PgCluster(free_port())
        self.db_url = self.pg.url.rsplit("/", 1)[0] + "/corral"
        self.cluster = Cluster(root)
        self.ledger_path = root / "ledger.txt"
        self.coordinators: list[Coordinator] = []
        self.runners: list[Runner] = []
        self.proxies: dict[str, list[FaultProxy]] = {}  # runner → its proxy to A, to B
        self.clients: list[JsonClient] = []
        self.jobs: list[Job] = []
        self.disruptions: list[Disruption] = []
        self.lock = threading.Lock()
        self.down: set[str] = set()  # processes the chaos holds down
        self.keys = itertools.count(1)
        self.repo: TaskRepo | None = None
        self.project_id = ""
        self.task_keys: list[str] = []
        self.actor_ids: list[str] = []
        self.actor_requests: list[ActorRequest] = []
        self.actor_ledger = root / "actor-ledger.txt"
        self.requests = itertools.count(1)
        # (coordinator, killed at, started again at): a request it was handling then may
        # get no answer at all.
        self.coordinator_downs: list[tuple[str, float, float]] = []
        self.pg_outages: list[tuple[float, float]] = []  # (stop asked, up again)
        self.calm_violations: list[str] = []

    # ---- set up and tear down ------------------------------------------------------------

    def _note(self, what: str) -> None:
        """The faults' log (``faults.log``), to read beside the processes' logs."""
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
        with open(self.root / "faults.log", "a") as log:
            log.write(f"{stamp} {what}\n")

    def post_mortem(self, violations: list[str], round_no: int) -> tuple[Path, list[str]]:
        """The stored history of the runs a violation names (their events, the runners),
        kept beside the logs (the database goes with the soak), and told as lines: each
        run's events with the faults of their time, for a CI log to explain itself."""
        run_ids = sorted({m for v in violations for m in re.findall(r"run_[0-9a-f]{12}", v)})
        path = self.root / f"post-mortem-round{round_no}.json"
        with psycopg.connect(self.db_url) as conn:
            runners = conn.execute("SELECT id, name, state FROM runners").fetchall()
            events = conn.execute(
                "SELECT run_id, at, runner_id, data FROM events WHERE kind = 'run' "
                "AND run_id = ANY(%s) ORDER BY seq",
                (run_ids,),
            ).fetchall()
        record = {
            "runners": [list(r) for r in runners],
            "events": [
                [run_id, datetime.fromtimestamp(at, UTC).isoformat(), runner_id, json.loads(data)]
                for run_id, at, runner_id, data in events
            ],
        }
        path.write_text(json.dumps(record, indent=1))
        names = {runner_id: name for runner_id, name, _ in runners}
        told: list[tuple[float, str]] = []
        for run_id, at, runner_id, data in events:
            fields = json.loads(data)
            told.append(
                (
                    at,
                    f"{run_id} {fields.get('status')} attempt {fields.get('attempts')} "
                    f"runner {names.get(runner_id, runner_id)} error {fields.get('error')!r}",
                )
            )
        if events:
            first, last = events[0][1] - 30.0, events[-1][1] + 5.0
            for line in (self.root / "faults.log").read_text().splitlines():
                at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
                if first <= at.timestamp() <= last:
                    told.append((at.timestamp(), f"fault: {line[24:]}"))
        for entry in read_entries(self.ledger_path, self.cluster.ledger_path):
            if entry.run_id in run_ids:
                told.append((entry.at, f"{entry.run_id} ledger: {entry.event} {entry.attempt}"))
        for d in self.disruptions:
            told.append((d.end, f"disruption {d.what} of {d.runner} since {_clock(d.start)}"))
        return path, [f"{_clock(at)} {what}" for at, what in sorted(told)]

    def open(self) -> None:
        self.pg.create()
        with psycopg.connect(self.pg.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE corral")
        db = self.db_url
        for name in ("coordinator-a", "coordinator-b"):
            coordinator = Coordinator(
                name,
                self.cluster.env,
                self.root,
                port=free_port(),
                db=db,
                lost_after_s=LOST_AFTER_S,
            )
            # WebSocket runners have their own threshold (20 s by default): the same here.
            coordinator.argv += ["--runner-lost-threshold", str(LOST_AFTER_S)]
            self.cluster.procs.append(coordinator)
            self.coordinators.append(coordinator)
            coordinator.start()
        for coordinator in self.coordinators:
            coordinator.wait_ready()
        self.cluster.coordinator = self.coordinators[-1]  # what cluster.client talks to
        self.clients = [JsonClient(c.url, TOKEN, timeout_s=10.0) for c in self.coordinators]
        config = self._actor_config()
        for name, transport in RUNNERS:
            proxies = [FaultProxy(c.port).start() for c in self.coordinators]
            self.proxies[name] = proxies
            url = ",".join(p.url for p in proxies)
            extra = ["--transport", transport]
            if transport == "websocket":  # long-poll runners host no actors
                extra += ["--config", str(config)]
            runner = self.cluster.start_runner(name, url=url, slots=SLOTS, extra=extra, wait=False)
            self.runners.append(runner)
        for name, _ in RUNNERS:
            self.cluster.wait_runner(name)
        (self.root / "tasks").mkdir()
        self.repo = TaskRepo(self.root / "tasks")
        project = self._insist(
            "POST",
            "/projects",
            json={
                "repo_path": str(self.repo.repo),
                "target_branch": "main",
                "retry_backoff_s": 0.2,
            },
        )
        self.project_id = project["project_id"]
        for i in range(ACTORS):  # get-or-create by key: asked again until one answer came
            actor = self._insist(
                "POST",
                "/actors",
                json={"name": ACTOR_KIND, "key": f"counter-{i}", "crash_policy": "restart"},
            )
            self.actor_ids.append(actor["actor_id"])

    def _actor_config(self) -> Path:
        locks = self.root / "actor-locks"
        locks.mkdir()
        config = self.root / "actors.toml"
        config.write_text(
            f"[actors.{ACTOR_KIND}]\n"
            f'command = ["{sys.executable}", "{ACTOR_SCRIPT}"]\n'
            f'env = {{ ACTOR_LEDGER = "{self.actor_ledger}", ACTOR_LOCKS = "{locks}" }}\n'
        )
        return config

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.cluster.close()
        for proxies in self.proxies.values():
            for proxy in proxies:
                proxy.close()
        self.pg.close()

    # ---- rounds ----------------------------------------------------------------------------

    def round(self, seconds: float, *, runs_per_s: float) -> Verdict:
        """``seconds`` of workload under chaos, then calm until every run ended; the
        invariants over everything so far."""
        self.figures.rounds += 1
        stop = threading.Event()
        chaos = threading.Thread(target=self._chaos, args=(stop,), name="chaos")
        chaos.start()
        senders = [
            threading.Thread(
                target=self._send_to_actors,
                args=(stop, random.Random(self.rng.random())),
                name=f"actors-{i}",
            )
            for i in range(ACTOR_SENDERS)
        ]
        for sender in senders:
            sender.start()
        try:
            self._add_plan()
            self._workload(time.monotonic() + seconds, runs_per_s)
        finally:
            stop.set()
            chaos.join()
            for sender in senders:
                sender.join()
        calm = time.monotonic()
        self._all_up()
        up = time.monotonic()
        self._settle()
        settled = time.monotonic()
        self._wake_every_actor()  # its backoff waits are counted apart (``backoff_wait_s``)
        self.figures.calm_s.append((up - calm, settled - up))
        verdict = self.check(settled=True)
        self.figures.verdict = verdict
        self.figures.actors = self.check_actors()
        return verdict

    def check(self, *, settled: bool) -> Verdict:
        runs = self._all_runs()
        entries: list[Entry] = read_entries(self.ledger_path, self.cluster.ledger_path)
        with psycopg.connect(self.db_url) as conn:
            names = dict(conn.execute("SELECT id, name FROM runners").fetchall())
            events: dict[str, list[dict[str, Any]]] = {}
            for run_id, at, runner_id, data in conn.execute(
                "SELECT run_id, at, runner_id, data FROM events WHERE kind = 'run' ORDER BY seq"
            ):
                events.setdefault(run_id, []).append(
                    {"at": at, "runner_id": runner_id, "data": json.loads(data)}
                )
        return check(self.jobs, runs, entries, events, names, self.disruptions, settled=settled)

    # ---- the actors ------------------------------------------------------------------------

    def _send_to_actors(self, stop: threading.Event, rng: random.Random) -> None:
        """Requests to random actors through random coordinators, one at a time, until the
        round's chaos ends."""
        while not stop.is_set():
            self._ask_actor(rng.choice(self.actor_ids), rng.randrange(len(self.coordinators)))

    def _ask_actor(self, actor_id: str, which: int) -> ActorRequest:
        coordinator = self.coordinators[which]
        request = ActorRequest(
            f"q{next(self.requests):06d}", actor_id, coordinator.name, time.time()
        )
        try:
            response = httpx.get(
                f"{coordinator.url}/gateway/{actor_id}/count/{request.request}",
                headers={"Authorization": f"Bearer {TOKEN}"},
                timeout=ACTOR_TIMEOUT_S,
            )
        except httpx.TransportError as exc:
            request.error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, httpx.ConnectError):
                time.sleep(0.1)  # that coordinator is down: not sent at all
        else:
            request.status, request.body = response.status_code, response.text
            if response.status_code != 200:
                request.code = _error_code(response)
        request.ended = time.time()
        with self.lock:
            self.actor_requests.append(request)
        return request

    def _wake_every_actor(self) -> None:
        """In the calm, every actor answers: a request to each, through either coordinator,
        until one is answered 200 (a few 503s while it starts again elsewhere are fine).
        An actor restarted often waits out its backoff first (2 s·2^n, up to 512 s)."""
        for actor_id in self.actor_ids:
            actor = self._insist("GET", f"/actors/{actor_id}")
            if actor["state"] == "stopped" and actor["reschedule_at"]:
                at = datetime.fromisoformat(actor["reschedule_at"]).timestamp()
                wait = max(0.0, min(at - time.time(), 600.0))
                self.figures.backoff_wait_s += wait
                time.sleep(wait)
            for attempt in range(12):
                if self._ask_actor(actor_id, attempt % len(self.coordinators)).status == 200:
                    break
                time.sleep(1.0)
            else:
                self.calm_violations.append(f"actor {actor_id} did not answer 200 in the calm")

    def check_actors(self) -> ActorVerdict:
        kv_counts = {}
        for actor_id in self.actor_ids:
            found = self._insist("GET", f"/actors/{actor_id}/kv", params={"prefix": "count"})
            counts = [int(e["value"]) for e in found["entries"] if e["key"] == "count"]
            kv_counts[actor_id] = counts[0] if counts else 0
        with self.lock:
            requests = list(self.actor_requests)
        verdict = check_actors(
            requests, read_ledger(self.actor_ledger), kv_counts, self.coordinator_downs
        )
        verdict.violations[:0] = self.calm_violations
        return verdict

    # ---- the task plan ---------------------------------------------------------------------

    def _add_plan(self) -> None:
        """Three tasks a round, the third after the other two, each writing its own file
        through the fake Claude; the plan works through them with two workers."""
        n = self.figures.rounds
        keys = [f"t{n}a", f"t{n}b", f"t{n}c"]
        tasks = [
            {
                "id": key,
                "title": f"Task {key}",
                "prompt": f"chaos {key} [fake:sleep=1][fake:write=files/{key}.txt:made by {key}]",
                "after": [keys[0], keys[1]] if key == keys[2] else [],
                "max_attempts": MAX_ATTEMPTS,
            }
            for key in keys
        ]
        # Adding a plan again changes nothing, so it is sent until one answer comes back.
        self._insist("POST", f"/projects/{self.project_id}/tasks", json={"tasks": tasks})
        self.task_keys += keys
        self._insist("POST", f"/projects/{self.project_id}/start", json={"workers": 2})

    def _insist(self, method: str, path: str, **kwargs: Any) -> Any:
        """An idempotent call, through one coordinator or the other until one answers."""
        for attempt in itertools.count():
            try:
                return self.clients[attempt % len(self.clients)].call(method, path, **kwargs)
            except InvalidRequest:
                raise
            except CorralError:
                if attempt > 120:
                    raise
                time.sleep(0.25)
        raise AssertionError("unreachable")

    def _tasks(self) -> dict[str, dict[str, Any]]:
        found = self._insist("GET", f"/projects/{self.project_id}/tasks")
        return {t["id"]: t for t in found["tasks"]}

    def check_plan(self) -> list[str]:
        """Every task completed, and on ``main`` once: one commit and one merge each, its
        file as the agent wrote it."""
        assert self.repo is not None
        violations = []
        tasks = self._tasks()
        subjects = Counter(self.repo.subjects())
        files = set(self.repo.tree_files())
        for key in self.task_keys:
            status = tasks[key]["status"]
            if status != "completed":
                violations.append(f"task {key} ended {status}: {tasks[key]['last_error']!r}")
                continue
            commits = subjects[f"corral: {key} Task {key}"]
            merges = subjects[f"corral: merge {key} Task {key}"]
            if (commits, merges) != (1, 1):
                violations.append(f"task {key} is on main in {commits} commits, {merges} merges")
            if f"files/{key}.txt" not in files:
                violations.append(f"task {key} completed, but its file is not on main")
            elif self.repo.show(f"files/{key}.txt").strip() != f"made by {key}":
                violations.append(f"task {key}'s file on main is not what its agent wrote")
        return violations

    # ---- the workload ----------------------------------------------------------------------

    def _workload(self, until: float, runs_per_s: float) -> None:
        kinds, weights = zip(*KINDS, strict=True)
        while (now := time.monotonic()) < until:
            self._send_cancels()
            kind = self.rng.choices(kinds, weights)[0]
            self._create(kind)
            time.sleep(max(0.0, now + self.rng.expovariate(runs_per_s) - time.monotonic()))

    def _create(self, kind: str) -> None:
        key = f"j{next(self.keys):05d}"
        want, exit_code, spec = "completed", 0, {}
        if kind == "agent":
            sleep = round(self.rng.uniform(0.2, 2.0), 2)
            prompt = f"chaos {key} [fake:sleep={sleep}]"
            spec, exit_code = {"type": "start_session", "prompt": prompt}, None
        else:
            seconds = {
                "short": self.rng.uniform(0.05, 1.0),
                "long": self.rng.uniform(4.0, 10.0),
                "fail": self.rng.uniform(0.05, 0.5),
                "cancel": 300.0,
            }[kind]
            code = 3 if kind == "fail" else 0
            script = COMMAND_SCRIPT.format(ledger=self.ledger_path)
            command = ["sh", "-c", script, key, f"{seconds:.2f}", str(code)]
            spec = {"type": "command", "command": command}
            if kind == "fail":
                want, exit_code = "failed", 3
            elif kind == "cancel":
                want, exit_code = "cancelled", None
        job = Job(key, kind, want, exit_code, time.time())
        if kind == "cancel":
            job.cancel_at = time.monotonic() + self.rng.uniform(0.5, 3.0)
        spec_type = spec.pop("type")
        # Sent again (to either coordinator) until one answers, with the job's idempotency
        # key: a create whose answer was lost gets the run it made, never a second one
        # (the check counts the runs of each job).
        first = self.rng.randrange(len(self.clients))
        for attempt in itertools.count():
            client = self.clients[(first + attempt) % len(self.clients)]
            try:
                created = client.create_run(
                    spec_type, idempotency_key=key, max_attempts=MAX_ATTEMPTS, **spec
                )
            except InvalidRequest:
                raise
            except CorralError:
                self.figures.creation_retries += 1
                if attempt > 120:
                    raise
                time.sleep(0.25)
                continue
            job.run_id = created["run_id"]
            break
        with self.lock:
            self.jobs.append(job)
            self.figures.created[kind] += 1

    def _send_cancels(self, runs: dict[str, dict[str, Any]] | None = None) -> None:
        """Cancel the runs due for it. ``runs``: every run (the calm after a round: all are
        due, and a run whose creation was not answered is found by its key)."""
        now = time.monotonic()
        by_key = {job_key(r): run_id for run_id, r in (runs or {}).items()}
        for job in self.jobs:
            if job.cancel_at is None or job.cancelled or (now < job.cancel_at and runs is None):
                continue
            job.run_id = job.run_id or by_key.get(job.key)
            if job.run_id is None:
                continue
            client = self.rng.choice(self.clients)
            try:
                client.cancel_run(job.run_id)
                job.cancelled = True
            except Conflict:
                job.cancelled = True  # it ended already: the check says whether as it should
            except CorralError:
                continue  # tried again on the next turn

    def _all_runs(self) -> dict[str, dict[str, Any]]:
        """Every run, through whichever coordinator answers."""
        for attempt in range(60):
            client = self.clients[attempt % len(self.clients)]
            try:
                runs: dict[str, dict[str, Any]] = {}
                before = None
                while True:
                    page = client.list_runs(limit=500, before=before)
                    runs.update((r["run_id"], r) for r in page["runs"])
                    if not (before := page["next"]):
                        return runs
            except CorralError:
                time.sleep(0.5)
        raise AssertionError("no coordinator listed the runs for 30 s")

    def _settle(self) -> None:
        """Until every run is final (the cancels due are sent)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            runs = self._all_runs()
            self._send_cancels(runs)
            still = [r for r in runs.values() if r["status"] not in TERMINAL]
            open_tasks = [k for k, t in self._tasks().items() if t["status"] not in TASK_FINAL]
            if still or open_tasks:
                self.figures.last_open = [
                    f"{r['run_id']} {r['status']} attempt {r['attempts']} on {r['runner_id']}"
                    for r in still
                ] + [f"task {key} not final" for key in open_tasks]
            if not still and not open_tasks:  # a cancel not sent yet finds its run final
                return
            time.sleep(0.5)
        # What is still open is reported by the check (runs not final).

    # ---- chaos ------------------------------------------------------------------------------

    def _chaos(self, stop: threading.Event) -> None:
        """Faults at random instants; each is healed after a while (a heap of repairs)."""
        repairs: list[tuple[float, int, Callable[[], None]]] = []
        order = itertools.count()
        faults = (
            (self._kill_runner, 3),
            (self._cut_off_runner, 2),
            (self._cut_link, 3),
            (self._kill_coordinator, 2),
            (self._restart_postgres, 1),
        )
        actions, weights = zip(*faults, strict=True)
        next_fault = time.monotonic() + self.rng.uniform(0.5, 1.5)
        while not stop.is_set() or repairs:
            now = time.monotonic()
            while repairs and (repairs[0][0] <= now or stop.is_set()):
                heapq.heappop(repairs)[2]()
            if not stop.is_set() and now >= next_fault:
                fault = self.rng.choices(actions, weights)[0]
                repaired = fault()
                if repaired is not None:
                    delay, repair = repaired
                    heapq.heappush(repairs, (now + delay, next(order), repair))
                next_fault = now + self.rng.uniform(0.8, 2.5)
            self._restart_the_fallen()
            time.sleep(0.05)

    def _restart_the_fallen(self) -> None:
        """A process that exited without the chaos killing it is counted and restarted
        (PostgreSQL down is no reason to exit: a coordinator started then waits for it)."""
        for proc in [*self.coordinators, *self.runners]:
            if proc.name not in self.down and not proc.alive():
                self.figures.unplanned_exits[proc.name] += 1
                self._note(f"{proc.name} exited by itself; starting it again")
                proc.kill()  # reaps it
                proc.start()

    def _kill_runner(self) -> tuple[float, Callable[[], None]] | None:
        candidates = [r for r in self.runners if r.name not in self.down]
        if not candidates:
            return None
        runner = self.rng.choice(candidates)
        start = time.time()
        self.down.add(runner.name)
        runner.kill()
        self.figures.runner_kills += 1
        self._note(f"killed {runner.name}")

        def restart() -> None:
            runner.start()
            self.down.discard(runner.name)
            self._note(f"started {runner.name}")
            self.disruptions.append(Disruption("kill", runner.name, start, time.time()))

        return self.rng.uniform(0.3, 3.0), restart

    def _cut_off_runner(self) -> tuple[float, Callable[[], None]] | None:
        name = self.rng.choice([n for n, _ in RUNNERS])
        proxies = self.proxies[name]
        if any(p.refusing for p in proxies):
            return None
        start = time.time()
        for proxy in proxies:
            proxy.refusing = True
            proxy.cut_all("both")
        self.figures.runner_cutoffs += 1
        long = self.rng.random() < 0.4
        self.figures.long_cutoffs += long
        self._note(f"cut off {name}" + (" (past its lease)" if long else ""))
        seconds = self.rng.uniform(
            *((LOST_AFTER_S + 1, LOST_AFTER_S + 4) if long else (0.3, LOST_AFTER_S / 2))
        )

        def heal() -> None:
            for proxy in proxies:
                proxy.refusing = False
            self._note(f"reconnected {name}")
            self.disruptions.append(Disruption("cut-off", name, start, time.time()))

        return seconds, heal

    def _cut_link(self) -> None:
        runner, proxies = self.rng.choice(list(self.proxies.items()))
        proxy = self.rng.choice(proxies)
        mode = self.rng.choice(CUT_MODES)
        cut = proxy.cut_all(mode)
        self.figures.link_cuts += cut
        self._note(f"cut {cut} links of {runner} to coordinator {proxies.index(proxy)} ({mode})")

    def _kill_coordinator(self) -> tuple[float, Callable[[], None]] | None:
        candidates = [c for c in self.coordinators if c.name not in self.down]
        if not candidates:
            return None
        coordinator = self.rng.choice(candidates)
        self.down.add(coordinator.name)
        killed_at = time.time()
        coordinator.kill()
        self.figures.coordinator_kills += 1
        start = time.time()
        # The other one killed, or started again but not answering yet (a start takes
        # seconds): no runner can reach either.
        others_down = any(not c.healthy() for c in self.coordinators if c is not coordinator)
        self._note(f"killed {coordinator.name}" + (" (the other is down)" if others_down else ""))

        def restart() -> None:
            coordinator.start()
            self.down.discard(coordinator.name)
            self._note(f"started {coordinator.name}")
            self.coordinator_downs.append((coordinator.name, killed_at, time.time()))
            if others_down:  # both were down a while: every runner was cut off
                self.disruptions.append(
                    Disruption("both coordinators down", None, start, time.time())
                )

        return self.rng.uniform(0.5, 4.0), restart

    def _restart_postgres(self) -> tuple[float, Callable[[], None]] | None:
        if "postgres" in self.down:
            return None
        self.down.add("postgres")
        mode = self.rng.choice(("fast", "immediate"))
        start = time.time()  # a stop refuses connections from its first instant
        self.pg.stop(mode)
        self._note(f"stopped PostgreSQL ({mode})")

        def restart() -> None:
            self.pg.start()
            self.down.discard("postgres")
            self._note("started PostgreSQL")
            self.pg_outages.append((start, time.time()))
            # Nothing is stored while the database is away: a WebSocket runner's socket is
            # closed when what it sent cannot be stored, it cannot register again, a
            # long-poll runner's heartbeats are not answered; once that lasted its lease,
            # it stops its work and the run is started again. That is an outage that cut
            # every runner off. The lease is short here (a third less than the 5 s
            # threshold), a runner's last answer may be a ping interval before the outage
            # began, and answers take a moment to resume after it: an outage of a second
            # counts. Outages close together count as one: the moment between them may
            # answer no one.
            began, ended = self.pg_outages[-1]
            for earlier_start, earlier_end in reversed(self.pg_outages[:-1]):
                if began - earlier_end > PG_OUTAGES_APART_S:
                    break
                began = earlier_start
            if ended - began >= PG_OUTAGE_CUTS_OFF_S:
                self.disruptions.append(Disruption("PostgreSQL down", None, began, ended))
            self.figures.postgres_restarts += 1

        # Now and then longer than the lost-runner threshold: leases run out while nothing
        # can be stored, and runs start again as new attempts, never beside the old ones.
        long = self.rng.random() < 0.3
        return self.rng.uniform(
            *((LOST_AFTER_S + 1, LOST_AFTER_S + 3) if long else (0.3, 2.0))
        ), restart

    def _all_up(self) -> None:
        for coordinator in self.coordinators:
            if not coordinator.alive():
                coordinator.kill()
                coordinator.start()
            coordinator.wait_ready()
        for runner in self.runners:
            if not runner.alive():
                runner.kill()
                runner.start()
        for name, _ in RUNNERS:
            self.cluster.wait_runner(name, timeout=60)


def _error_code(response: httpx.Response) -> str | None:
    """The stable code of a refusal: the JSON error's, or the x-corral-error header's."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        code = error.get("code") if isinstance(error, dict) else body.get("code")
        if isinstance(code, str) and code:
            return code
    return response.headers.get("x-corral-error")


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S.%f")[:-3]


def soak(
    root: Path,
    *,
    seed: int,
    rounds: int | None = None,
    minutes: float | None = None,
    round_s: float = 60.0,
    runs_per_s: float = 2.0,
    report: Callable[[str], None] = print,
) -> Figures:
    """Rounds under chaos until ``rounds`` or ``minutes`` are done; the figures."""
    the_soak = Soak(root, seed)
    figures = the_soak.figures
    try:
        the_soak.open()
        report(
            f"seed {seed}: {len(the_soak.coordinators)} coordinators, "
            f"{len(the_soak.runners)} runners up ({time.monotonic() - figures.started:.0f}s)"
        )
        deadline = figures.started + minutes * 60 if minutes is not None else None
        reported: set[str] = set()
        while (rounds is None or figures.rounds < rounds) and (
            deadline is None or time.monotonic() < deadline
        ):
            the_soak.round(round_s, runs_per_s=runs_per_s)
            # Each check covers every run so far: a violation is told the first time.
            new = [v for v in figures.violations if v not in reported]
            reported.update(new)
            for violation in new:
                report(f"VIOLATION (round {figures.rounds}): {violation}")
            report(figures.line())
            if figures.calm_s[-1][1] > 30:
                report(f"slow to end after the chaos: {'; '.join(figures.last_open[:8])}")
            if new:
                path, story = the_soak.post_mortem(new, figures.rounds)
                report(f"post-mortem: {path}")
                for line in story:
                    report(f"  {line}")
    finally:
        the_soak.close()
    return figures


def _terminated(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the clean-up must not be cut
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--round-s", type=float, default=60.0, help="chaos per round")
    parser.add_argument("--runs-per-s", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--root", type=Path, default=None, help="keep everything here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    # SIGTERM (a timeout, a CI job cancelled) ends the soak as Ctrl-C does: its finally
    # clauses stop the coordinators, runners, proxies and PostgreSQL it started, which
    # Python's default (death at once) would leave running.
    signal.signal(signal.SIGTERM, _terminated)
    import tempfile

    root = args.root or Path(tempfile.mkdtemp(prefix="corral-chaos-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        figures = soak(
            root,
            seed=seed,
            minutes=args.minutes,
            round_s=args.round_s,
            runs_per_s=args.runs_per_s,
        )
    except KeyboardInterrupt:
        print(f"stopped; everything it started is stopped (seed {seed}, root {root})")
        return 130
    print(json.dumps({"seed": seed, "root": str(root), "summary": figures.line()}))
    return 1 if figures.violations else 0


if __name__ == "__main__":
    sys.exit(main())
