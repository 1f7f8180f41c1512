"""Tokens in the store: created, listed, revoked, and looked up by their hash."""

from __future__ import annotations

import json
from collections.abc import Sequence

from corral.errors import InvalidRequest
from corral.ids import new_token_id
from corral.store.db import Database, Row
from corral.store.rows import dumps, row_by_id
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

    def find(self, token_hash: str) -> Token | None:
        """The live token with this hash (the hash of 256 random bits: looking it up by
        index tells a guesser nothing)."""
        with self.db.transaction(write=False) as tx:
            row = tx.one(
                "SELECT * FROM tokens WHERE token_hash = ? AND revoked_at IS NULL", (token_hash,)
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
    )
