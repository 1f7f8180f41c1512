"""REST routes for tokens (admin only): create one, list them, revoke one."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from corral.coordinator.auth import Access, require
from corral.coordinator.schemas import iso
from corral.coordinator.service import Coordinator
from corral.tokens import Role, Token
from corral.wire import WireModel

router = APIRouter(prefix="/tokens", tags=["tokens"], dependencies=[require(Access.ADMIN)])


class CreateToken(WireModel):
    role: Role
    name: str = Field("", max_length=200)
    labels: list[str] | None = Field(
        None, max_length=100, description="a runner token: the only labels its runners may have"
    )


def token_json(token: Token) -> dict[str, Any]:
    return {
        "token_id": token.id,
        "name": token.name,
        "role": token.role,
        "labels": None if token.labels is None else list(token.labels),
        "created_at": iso(token.created_at),
        "revoked_at": iso(token.revoked_at),
    }


def _coordinator(request: Request) -> Coordinator:
    coordinator: Coordinator = request.app.state.coordinator
    return coordinator


@router.post("", status_code=201)
async def create_token(body: CreateToken, request: Request) -> dict[str, Any]:
    """A new token; its secret is in this answer only (the store keeps its hash)."""
    coordinator = _coordinator(request)
    token, secret = await coordinator.in_thread(
        coordinator.store.tokens.create,
        body.name,
        body.role,
        coordinator.clock.now(),
        body.labels,
    )
    return {**token_json(token), "token": secret}


@router.get("")
async def list_tokens(request: Request) -> dict[str, Any]:
    coordinator = _coordinator(request)
    tokens = await coordinator.in_thread(coordinator.store.tokens.list)
    return {"tokens": [token_json(t) for t in tokens]}


@router.post("/{token_id}/revoke")
async def revoke_token(token_id: str, request: Request) -> dict[str, Any]:
    """Refuse the token from now on (other coordinator processes within a few seconds)."""
    coordinator = _coordinator(request)
    token = await coordinator.in_thread(
        coordinator.store.tokens.revoke, token_id, coordinator.clock.now()
    )
    coordinator.auth.forget(token.id)
    await coordinator.close_token(token.id)
    return token_json(token)
