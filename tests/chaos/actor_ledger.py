"""The chaos soak's actors: what their requests got, what the actors' own ledger says, and
the invariants between the two (``check_actors``).

Each actor (``chaos_actor.py``) keeps a counter in its KV and appends a line to the ledger
for each request it ran (``hit``), one when a generation starts (``start``) and one when
it found another generation of the same actor alive (``overlap``: it holds a lock the
kernel frees only when a process is gone). The soak sends ``GET /count/<request>``
through the gateway of either coordinator, and records each answer.

* every request is answered exactly once: 200 with the count the actor wrote for it
  (its ledger has that request, once, with that count), or a 5xx with a stable error
  code; a request left without any answer only when the coordinator it went to was killed
  meanwhile, which cuts its connection (one whose connection was refused never reached a
  coordinator) — one that waited out the client's timeout hung, whatever was killed;
* no request ran twice (two ``hit`` lines), whatever its answer;
* an actor's counter never goes backwards and never counts twice: its ``hit`` lines, in
  the order written, count strictly up, and the KV's count is at least the last of them;
* never two live generations of an actor (no ``overlap``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path


@dataclass
class ActorRequest:
    request: str
    actor_id: str
    coordinator: str  # its name
    sent: float
    ended: float = 0.0
    status: int | None = None  # None: no HTTP answer (error says what happened)
    body: str = ""
    code: str | None = None  # the stable error code of a refusal
    error: str | None = None


@dataclass
class Hit:
    actor_id: str
    generation: int
    request: str
    count: int
    at: float


@dataclass
class ActorLedger:
    hits: list[Hit] = field(default_factory=list)
    starts: Counter[str] = field(default_factory=Counter)  # generations started, by actor
    overlaps: list[str] = field(default_factory=list)


@dataclass
class ActorVerdict:
    violations: list[str] = field(default_factory=list)
    answers: Counter[str] = field(default_factory=Counter)  # "200", "503 code", "no answer"
    generations: int = 0


def read_ledger(path: Path) -> ActorLedger:
    ledger = ActorLedger()
    if not path.exists():
        return ledger
    for line in path.read_text().splitlines():
        parts = line.split()
        if not parts or (parts[0] == "hit" and len(parts) < 6):
            continue  # a line cut short by a kill in the middle of its write
        if parts[0] == "hit":
            _, actor_id, gen, request, count, at = parts[:6]
            ledger.hits.append(Hit(actor_id, int(gen), request, int(count), float(at)))
        elif parts[0] == "start" and len(parts) >= 3:
            ledger.starts[parts[1]] += 1
        elif parts[0] == "overlap":
            ledger.overlaps.append(line)
    return ledger


def check_actors(
    requests: list[ActorRequest],
    ledger: ActorLedger,
    kv_counts: dict[str, int],
    coordinator_downs: list[tuple[str, float, float]],
) -> ActorVerdict:
    """The invariants above; ``kv_counts``: each actor's ``count`` in its KV now;
    ``coordinator_downs``: (name, killed at, started again at) of each coordinator kill."""
    verdict = ActorVerdict(generations=sum(ledger.starts.values()))
    bad = verdict.violations.append
    ran: dict[str, list[Hit]] = defaultdict(list)
    for hit in ledger.hits:
        ran[hit.request].append(hit)
    for request, hits in ran.items():
        if len(hits) > 1:
            seen = [(h.generation, h.count) for h in hits]
            bad(f"request {request} ran {len(hits)} times (generation, count): {seen}")
    for r in requests:
        hits = ran.get(r.request, [])
        if r.status == 200:
            verdict.answers["200"] += 1
            if not hits:
                bad(f"request {r.request} to {r.actor_id} answered 200 ({r.body}), never ran")
            elif r.body.strip() != str(hits[0].count) or hits[0].actor_id != r.actor_id:
                bad(f"request {r.request} answered {r.body!r}, its actor counted {hits[0].count}")
        elif r.status is not None:
            verdict.answers[f"{r.status} {r.code}"] += 1
            if r.status < 500 or not r.code:
                bad(f"request {r.request} to {r.actor_id} failed {r.status} without a code: "
                    f"{r.body[:200]!r}")  # fmt: skip
        elif r.error is not None and r.error.startswith(("ConnectError", "ConnectTimeout")):
            verdict.answers["not sent (coordinator down)"] += 1  # refused: never reached it
        elif r.error is not None and "Timeout" in r.error:
            verdict.answers["no answer (timed out)"] += 1
            bad(f"request {r.request} to {r.actor_id} through {r.coordinator} got no answer "
                f"in {r.ended - r.sent:.0f} s ({r.error}): a hang")  # fmt: skip
        else:
            verdict.answers["no answer"] += 1
            killed = any(
                name == r.coordinator and start <= r.ended and end >= r.sent
                for name, start, end in coordinator_downs
            )
            if not killed:
                bad(f"request {r.request} to {r.actor_id} through {r.coordinator} got no "
                    f"answer ({r.error}), and that coordinator was not killed")  # fmt: skip
    by_actor: dict[str, list[Hit]] = defaultdict(list)
    for hit in ledger.hits:
        by_actor[hit.actor_id].append(hit)
    for actor_id, hits in by_actor.items():
        for before, after in pairwise(hits):
            if after.count <= before.count:
                bad(f"actor {actor_id}'s counter went from {before.count} (generation "
                    f"{before.generation}) to {after.count} (generation "
                    f"{after.generation})")  # fmt: skip
        if kv_counts.get(actor_id, 0) < hits[-1].count:
            bad(f"actor {actor_id}'s KV count {kv_counts.get(actor_id)} is below the "
                f"{hits[-1].count} it counted")  # fmt: skip
    for line in ledger.overlaps:
        bad(f"two live generations: {line}")
    return verdict
