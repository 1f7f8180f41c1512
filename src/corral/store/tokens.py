"""Tokens in the store: created, listed, revoked, and looked up by their hash."""

from __future__ import annotations

import json
from collections.abc import Sequence

from corral.errors import InvalidRequest, LeaseLost
from corral.ids import new_token_id
from corral.runs import RunStatus
from corral.store.claims import leased_row
from corral.store.db import Database, Row
from corral.store.rows import HELD, dumps, row_by_id
from corral.tokens import Role, Token, digest, new_secret


class TokenStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create(
        self, name: str, role: Role, now: float, labels: Sequence[str] | None = None
    ) -> tuple[Token, str]:
        """A new token and its secret: the only time the secret is seen."""
        if labels is not None and role is not Role.RUNNER:
            raise InvalidRequest("only a runner token can be limited to labels")
        if role is Role.AGENT:
            raise InvalidRequest("an agent token is minted for a run by its runner, not made")
        secret = new_secret()
        token = Token(
            id=new_token_id(),
            name=name,
            role=role,
            labels=None if labels is None else tuple(sorted(set(labels))),
            created_at=now,
        )
        with self.db.transaction() as tx:
            tx.execute(
                "INSERT INTO tokens (id, name, role, token_hash, labels, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    token.id,
                    name,
                    str(role),
                    digest(secret),
                    None if token.labels is None else dumps(list(token.labels)),
                    now,
                ),
            )
        return token, secret

    def list(self) -> list[Token]:
        with self.db.transaction(write=False) as tx:
            rows = tx.execute("SELECT * FROM tokens ORDER BY created_at, id")
        return [_token(r) for r in rows]

    def get(self, token_id: str) -> Token:
        with self.db.transaction(write=False) as tx:
            return _token(row_by_id(tx, "tokens", token_id))

    def revoke(self, token_id: str, now: float) -> Token:
        """From now on the token is refused (a second revoke changes nothing)."""
        with self.db.transaction() as tx:
            row_by_id(tx, "tokens", token_id)
            tx.execute(
                "UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                (now, token_id),
            )
            return _token(row_by_id(tx, "tokens", token_id))

    def mint_for_run(
        self, run_id: str, runner_id: str, attempt: int, now: float, ttl_s: float
    ) -> tuple[Token, str]:
        """An agent token for this attempt of the run, which ``runner_id`` must hold
        (LeaseLost otherwise); it lives while the attempt holds the run, ``ttl_s`` at most.
        Expired agent tokens are deleted on the way (they accumulate one per agent run)."""
        secret = new_secret()
        token = Token(
            id=new_token_id(),
            name=f"agent of {run_id}",
            role=Role.AGENT,
            labels=None,
            created_at=now,
            run_id=run_id,
            expires_at=now + ttl_s,
        )
        with self.db.transaction() as tx:
            row = leased_row(tx, run_id, runner_id, attempt)
            if not RunStatus(row["status"]).holds_lease:
                raise LeaseLost(f"run {run_id} is {row['status']}: it needs no agent token")
            tx.execute("DELETE FROM tokens WHERE run_id IS NOT NULL AND expires_at < ?", (now,))
            tx.execute(
                "INSERT INTO tokens (id, name, role, token_hash, created_at, run_id, "
                "run_attempt, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    token.id,
                    token.name,
                    str(Role.AGENT),
                    digest(secret),
                    now,
                    run_id,
                    attempt,
                    token.expires_at,
                ),
            )
        return token, secret

    def find(self, token_hash: str, now: float) -> Token | None:
        """The live token with this hash (the hash of 256 random bits: looking it up by
        index tells a guesser nothing). An agent token lives while the attempt it was
        minted for holds its run, and not past its expiry."""
        with self.db.transaction(write=False) as tx:
            row = tx.one(
                "SELECT t.* FROM tokens t LEFT JOIN runs r ON r.id = t.run_id "
                "WHERE t.token_hash = ? AND t.revoked_at IS NULL AND (t.run_id IS NULL OR "
                f"(r.status IN ({HELD}) AND r.attempts = t.run_attempt "
                "AND t.expires_at > ?))",
                (token_hash, now),
            )
        return None if row is None else _token(row)


def _token(row: Row) -> Token:
    return Token(
        id=row["id"],
        name=row["name"],
        role=Role(row["role"]),
        labels=None if row["labels"] is None else tuple(json.loads(row["labels"])),
        created_at=row["created_at"],
        revoked_at=row["revoked_at"],
        run_id=row["run_id"],
        expires_at=row["expires_at"],
    )
