"""The work a plan file can cause is bounded: its size, what its YAML aliases expand to,
its depth, and the length of any error message quoting it ("billion laughs")."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from corral.errors import InvalidRequest
from corral.tasks.plan import MAX_PLAN_BYTES, load_plan, parse_plan

MAX_MESSAGE = 300
TASKS = "tasks: [{id: a, title: A}]\n"


def nested_aliases() -> str:
    """Nine levels of nine aliases each: under 400 bytes, 9^9 values once expanded."""
    levels = ['&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True):
        levels.append(f"&{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "[" + ", ".join(levels) + "]"


def refused(text: str, fmt: str = "yaml") -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse_plan(text, fmt, "plan")  # type: ignore[arg-type]
    assert len(str(caught.value)) < MAX_MESSAGE, str(caught.value)[:1000]
    return caught.value


@pytest.mark.parametrize(
    "text",
    [
        f"target_branch: {nested_aliases()}\n{TASKS}",  # its error message quoted it all
        f"budget_usd: {nested_aliases()}\n{TASKS}",
        f"tasks: [{{id: a, title: A, labels: {nested_aliases()}}}]\n",
        f"tasks: {nested_aliases()}\n",
    ],
    ids=["branch", "budget", "labels", "tasks"],
)
def test_nested_aliases_are_refused_by_their_bound(text: str) -> None:
    assert len(text) < 500
    tracemalloc.start()
    try:
        error = refused(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert error.code == "plan_too_large"
    assert "aliases expanded" in str(error)
    assert peak < 32 * 1024 * 1024  # unbounded: gigabytes (and minutes)


def test_one_long_string_aliased_many_times_is_refused() -> None:
    text = f"x: &s '{'y' * 200_000}'\ntasks:\n" + "".join(
        f"  - {{id: t{i}, title: *s}}\n" for i in range(100)
    )
    assert refused(text).code == "plan_too_large"


def test_a_few_aliases_are_fine() -> None:
    text = "tasks:\n  - {id: a, title: A, labels: &l [x, y]}\n  - {id: b, title: B, labels: *l}\n"
    plan = parse_plan(text, "yaml", "plan")
    assert [t.labels for t in plan.tasks] == [("x", "y"), ("x", "y")]


@pytest.mark.parametrize("depth", [40, 100_000])
def test_deep_nesting_is_refused(depth: int) -> None:
    text = "tasks: " + "[" * depth + "]" * depth + "\n"
    assert refused(text).code in ("plan_too_large", "invalid_request")


def test_deep_toml_nesting_is_refused() -> None:
    text = "tasks = " + "[" * 100_000 + "]" * 100_000 + "\n"
    assert refused(text, "toml").code in ("plan_too_large", "invalid_request")


def test_a_huge_value_is_quoted_as_an_excerpt() -> None:
    text = "target_branch: [" + ", ".join(["x" * 1000] * 200) + "]\n" + TASKS
    assert "target_branch must be a non-empty string" in str(refused(text))


def test_an_integer_of_thousands_of_digits_is_refused() -> None:
    refused("max_attempts: " + "9" * 5000 + "\n" + TASKS)
    refused("max_attempts = " + "9" * 5000 + "\n" + 'tasks = [{id = "a", title = "A"}]\n', "toml")


def test_a_file_over_the_size_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(TASKS + "#" * MAX_PLAN_BYTES + "\n")
    with pytest.raises(InvalidRequest) as caught:
        load_plan(path)
    assert caught.value.code == "plan_too_large"
    assert refused(TASKS + "#" * MAX_PLAN_BYTES).code == "plan_too_large"
