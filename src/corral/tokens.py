"""Bearer tokens: who may call the coordinator, and as what (the role).

    admin   everything, including tokens and runners (drain, stop)
    client  create and cancel runs, sessions, tasks; read everything
    reader  read only
    runner  the runner endpoints only (``/runner/…``), optionally limited to labels
    agent   an agent's own, minted for one attempt of its run when its runner asks
            (``POST /runner/runs/{id}/agent-token``): reads, and starts or cancels only its
            session's children; refused once the attempt no longer holds the run

A token is 256 random bits; only its SHA-256 is stored, so a copy of the database gives no
token away. The admin token of ``CORRAL_TOKEN`` (or ``.corral/credentials``) is not stored at
all: the coordinator compares it in constant time.
"""

from __future__ import annotations

import enum
import hashlib
import secrets
from dataclasses import dataclass

SECRET_PREFIX = "crl_"


class Role(enum.StrEnum):
    ADMIN = "admin"
    CLIENT = "client"
    READER = "reader"
    RUNNER = "runner"
    AGENT = "agent"


@dataclass(frozen=True)
class Token:
    id: str
    name: str
    role: Role
    # A runner token: the labels its runners may advertise (None: any).
    labels: tuple[str, ...] | None
    created_at: float
    revoked_at: float | None = None
    # An agent token: the run whose attempt it was minted for, and when it expires.
    run_id: str | None = None
    expires_at: float | None = None


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    """What is stored and looked up: a token's SHA-256 (enough for 256 random bits)."""
    return hashlib.sha256(secret.encode()).hexdigest()
