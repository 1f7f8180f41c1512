"""Fixtures shared by the coordinator API tests; their helpers are in ``api_fixtures``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from api_fixtures import BACKENDS, backend_url


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh coordinator database on each backend (ids ``sqlite`` and ``postgres``)."""
    with backend_url(request.param, tmp_path) as url:
        yield url
