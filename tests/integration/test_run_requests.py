"""Idempotency keys of the requests that create runs (``corral.store.run_requests``), on
both databases: a request sent again gets the runs it created, never new ones — also when
the two arrive at once — and a key stands for one caller's one request."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from corral.errors import InvalidRequest, NotFound
from corral.runs import NewRun, RunType
from corral.store import Store, run_requests
from corral.store.retention import Retention
from corral.store.run_requests import KEPT_S, RunRequest

NOW = 1_700_000_000.0
ASKED = [{"type": "command", "command": ["true"]}]


def command(*argv: str) -> NewRun:
    return NewRun(type=RunType.COMMAND, command=argv or ("true",))


def test_a_request_sent_again_gets_the_runs_it_created(store: Store) -> None:
    request = RunRequest.of("token-a", "k1", ASKED * 2)
    first = store.runs.create_many([command(), command()], NOW, request)
    again = store.runs.create_many([command(), command()], NOW + 5, request)
    assert [r.id for r in again] == [r.id for r in first]
    assert store.runs.count_by_status() == {"pending": 2}


def test_the_runs_come_back_as_they_are_now(store: Store) -> None:
    request = RunRequest.of("token-a", "k1", ASKED)
    (run,) = store.runs.create_many([command()], NOW, request)
    store.runs.request_cancel(run.id, NOW + 1)
    (again,) = store.runs.create_many([command()], NOW + 2, request)
    assert again.id == run.id and again.status == "cancelled"


def test_a_key_sent_with_other_runs_is_refused(store: Store) -> None:
    store.runs.create_many([command()], NOW, RunRequest.of("token-a", "k1", ASKED))
    other = RunRequest.of("token-a", "k1", [{"type": "command", "command": ["false"]}])
    with pytest.raises(InvalidRequest) as refused:
        store.runs.create_many([command("false")], NOW, other)
    assert refused.value.code == "idempotency_key_reused"
    assert store.runs.count_by_status() == {"pending": 1}  # and nothing was written


def test_a_key_belongs_to_its_caller(store: Store) -> None:
    mine = store.runs.create_many([command()], NOW, RunRequest.of("token-a", "k1", ASKED))
    theirs = store.runs.create_many([command()], NOW, RunRequest.of("token-b", "k1", ASKED))
    assert mine[0].id != theirs[0].id


def test_a_request_refused_leaves_its_key_free(store: Store) -> None:
    """The key is taken in the transaction that creates the runs: refused (here a sub-agent
    of a parent that does not exist), nothing is kept, and the request may be sent again."""
    request = RunRequest.of("token-a", "k1", ASKED)
    orphan = NewRun(type=RunType.COMMAND, command=("true",), parent_session="no-such")
    with pytest.raises(NotFound, match="no-such"):
        store.runs.create_many([orphan], NOW, request)
    (run,) = store.runs.create_many([command()], NOW, request)
    assert store.runs.get(run.id).status == "pending"


def test_requests_with_one_key_at_once_create_the_runs_once(store: Store) -> None:
    """Eight threads send the same request at once: on PostgreSQL the key's unique index
    makes the later ones wait for the first's commit, then read its runs; SQLite has one
    writer."""
    request = RunRequest.of("token-a", "k1", ASKED)
    start = threading.Barrier(8)
    answers: list[str] = []

    def send() -> None:
        start.wait()
        (run,) = store.runs.create_many([command()], NOW, request)
        answers.append(run.id)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 8 and len(set(answers)) == 1
    assert store.runs.count_by_status() == {"pending": 1}


def test_keys_are_kept_a_day(store: Store) -> None:
    request = RunRequest.of("token-a", "k1", ASKED)
    (run,) = store.runs.create_many([command()], NOW, request)
    keep_runs = Retention(runs_s=None, runners_s=None, log_chars=None, events_s=None)
    assert store.collect_garbage(keep_runs, NOW + KEPT_S - 1).run_requests == 0
    assert store.runs.create_many([command()], NOW + KEPT_S - 1, request)[0].id == run.id
    assert store.collect_garbage(keep_runs, NOW + KEPT_S + 1).run_requests == 1
    (later,) = store.runs.create_many([command()], NOW + KEPT_S + 2, request)
    assert later.id != run.id  # a new request now


@pytest.mark.parametrize("key", ["", "x" * 256, "naïve", "a\nb", "a\x00b"])
def test_a_key_is_1_to_255_printable_ascii_characters(key: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        RunRequest.of("token-a", key, ASKED)
    assert refused.value.code == "invalid_idempotency_key"
    assert RunRequest.of("token-a", "x" * 255, ASKED).key == "x" * 255


@pytest.mark.parametrize("dialect", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_key_deleted_between_its_conflict_and_its_read_is_taken_again(
    store: Store, store_url: str
) -> None:
    """Retention deletes a day-old key just after a request sent again found it taken: the
    request takes it afresh (it raised an AssertionError, a 500). The window is widened: the
    delete runs, from another connection, right after the conflicting insert."""
    old = RunRequest.of("token-a", "k1", ASKED)
    store.runs.create_many([command()], NOW, old)

    class DeletedAfterTheConflict:
        def __init__(self, tx: Any) -> None:
            self.tx, self.conflicts = tx, 0

        def one(self, sql: str, params: Any) -> Any:
            row = self.tx.one(sql, params)
            if sql.startswith("INSERT") and row is None:
                self.conflicts += 1
                with psycopg.connect(store_url, autocommit=True) as other:
                    other.execute("DELETE FROM run_requests")
            return row

    with store.db.transaction() as tx:
        widened = DeletedAfterTheConflict(tx)
        assert run_requests.take(widened, old, ["run_new"], NOW + KEPT_S + 1) is None
    assert widened.conflicts == 1
    with store.db.transaction() as tx:
        assert run_requests.take(tx, old, ["run_other"], NOW + KEPT_S + 2) == ["run_new"]
