"""The store's last line of defence: a value the database cannot hold that got past the
edge checks is the caller's bad input (``unstorable_value``), never a driver error, and
the store goes on working."""

from __future__ import annotations

import pytest

from corral.errors import InvalidRequest
from corral.runs import NewRun, RunType
from corral.store import Store

NOW = 1000.0


def refuses(store: Store, spec: NewRun) -> None:
    with pytest.raises(InvalidRequest) as caught:
        store.runs.create(spec, NOW)
    assert caught.value.code == "unstorable_value"


def test_a_lone_surrogate_is_refused(store: Store) -> None:
    refuses(store, NewRun(type=RunType.COMMAND, command=("echo",), prompt="\ud800"))
    assert store.runs.list() == []
    store.runs.create(NewRun(type=RunType.COMMAND, command=("echo",)), NOW)
    assert len(store.runs.list()) == 1


def test_an_integer_beyond_its_column_is_refused(store: Store) -> None:
    refuses(store, NewRun(type=RunType.COMMAND, command=("echo",), priority=2**64))
    assert store.runs.list() == []


@pytest.mark.parametrize("dialect", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_nul_is_refused_on_postgresql(store: Store) -> None:
    refuses(store, NewRun(type=RunType.COMMAND, command=("echo",), session_name="a\x00b"))
    refuses(store, NewRun(type=RunType.COMMAND, command=("echo",), max_attempts=2**40))
    refuses_batch(store, NewRun(type=RunType.COMMAND, command=("echo",), session_name="a\x00b"))
    refuses_batch(store, NewRun(type=RunType.COMMAND, command=("echo",), max_attempts=2**40))
    assert store.runs.list() == []


@pytest.mark.parametrize(
    "bad",
    [
        {"prompt": "\ud800"},
        {"priority": 2**64},
    ],
)
def test_a_batch_with_a_value_that_cannot_be_stored_is_refused_whole(
    store: Store, bad: dict[str, object]
) -> None:
    """A batch (one statement on PostgreSQL, its rows one JSON parameter) is refused as
    one run alone is, and none of its runs is written."""
    refuses_batch(store, NewRun(type=RunType.COMMAND, command=("echo",), **bad))  # type: ignore[arg-type]


def refuses_batch(store: Store, bad: NewRun) -> None:
    ok = NewRun(type=RunType.COMMAND, command=("echo",))
    with pytest.raises(InvalidRequest) as caught:
        store.runs.create_many([ok, bad, ok], NOW)
    assert caught.value.code == "unstorable_value"
    assert store.runs.list() == []
