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
    assert store.runs.list() == []
