"""``WireModel`` refuses unstorable values in the fields a peer sent, naming the first."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from corral.coordinator.schemas import CreateRun


def test_the_first_unstorable_field_in_the_models_order_is_named() -> None:
    """Only sent fields are checked (defaults are corral's), yet the error names the
    first refused field in the model's order, whatever order the check found them in."""
    body = {"env": {"K": "\ud800"}, "command": ["a\x00"], "prompt": "\x00", "type": "command"}
    with pytest.raises(ValidationError, match="prompt: text contains NUL"):
        CreateRun.model_validate(body)
    with pytest.raises(ValidationError, match="env: text contains a lone surrogate"):
        CreateRun.model_validate({"type": "command", "env": {"K": "\ud800"}, "labels": []})
    assert CreateRun.model_validate({"type": "command", "command": ["true"]}).labels == []
