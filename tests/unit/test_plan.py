"""Plan files (``corral.tasks.plan``): parsing, validation, graph checks and ordering."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.errors import InvalidRequest
from corral.tasks.model import TaskSpec
from corral.tasks.plan import check_graph, load_plan, parse_plan, topological_order

FULL_YAML = """\
target_branch: main
merge: ff
on_no_changes: complete
agent: claude
max_attempts: 4
budget_usd: 10
tasks:
  - id: schema
    title: Add the schema
    prompt: |
      Create db/schema.sql
    priority: 10
    labels: [python, db]
    agent: researcher
    max_attempts: 2
    budget_usd: 1.5
  - id: api
    title: Add the API
    after: [schema]
"""

FULL_TOML = """\
target_branch = "main"
merge = "ff"
on_no_changes = "complete"
agent = "claude"
max_attempts = 4
budget_usd = 10.0

[[tasks]]
id = "schema"
title = "Add the schema"
prompt = "Create db/schema.sql\\n"
priority = 10
labels = ["python", "db"]
agent = "researcher"
max_attempts = 2
budget_usd = 1.5

[[tasks]]
id = "api"
title = "Add the API"
depends_on = ["schema"]
"""


def spec(key: str, *after: str) -> TaskSpec:
    return TaskSpec(key=key, title=key, prompt=key, after=after)


def yaml_tasks(body: str, head: str = "") -> str:
    return f"{head}tasks:\n{body}"


def refused(text: str, fmt: str = "yaml") -> str:
    """The message of the ``InvalidRequest`` parsing ``text`` raises."""
    with pytest.raises(InvalidRequest) as info:
        parse_plan(text, fmt, "plan.yaml")  # type: ignore[arg-type]
    assert info.value.message.startswith("plan.yaml")
    return info.value.message


# ---- valid plans -----------------------------------------------------------------------------


def test_full_yaml_plan() -> None:
    plan = parse_plan(FULL_YAML, "yaml", "plan.yaml")
    assert (plan.target_branch, plan.merge, plan.on_no_changes) == ("main", "ff", "complete")
    assert plan.budget_usd == 10.0
    assert isinstance(plan.budget_usd, float)
    schema, api = plan.tasks
    assert schema == TaskSpec(
        key="schema",
        title="Add the schema",
        prompt="Create db/schema.sql\n",
        priority=10,
        labels=("python", "db"),
        agent="researcher",
        max_attempts=2,
        budget_usd=1.5,
    )
    # the plan's defaults apply; the prompt defaults to the title
    assert api == TaskSpec(
        key="api",
        title="Add the API",
        prompt="Add the API",
        after=("schema",),
        agent="claude",
        max_attempts=4,
    )
    assert len(plan.digest) == 64


def test_yaml_and_toml_of_the_same_plan_have_the_same_digest() -> None:
    from_yaml = parse_plan(FULL_YAML, "yaml", "a.yaml")
    from_toml = parse_plan(FULL_TOML, "toml", "a.toml")
    assert from_toml == from_yaml


def test_digest_is_stable_and_changes_with_the_content() -> None:
    first = parse_plan(FULL_YAML, "yaml", "plan.yaml").digest
    assert parse_plan(FULL_YAML, "yaml", "elsewhere.yaml").digest == first
    changed = FULL_YAML.replace("priority: 10", "priority: 11")
    assert parse_plan(changed, "yaml", "plan.yaml").digest != first
    # an explicit default is the same content as an omitted one
    explicit = FULL_YAML.replace("tasks:", "tasks:\n  - {id: x, title: X, priority: 0}", 1)
    implicit = FULL_YAML.replace("tasks:", "tasks:\n  - {id: x, title: X}", 1)
    assert parse_plan(explicit, "yaml", "p").digest == parse_plan(implicit, "yaml", "p").digest


def test_defaults() -> None:
    plan = parse_plan("tasks:\n  - {id: only, title: Do it}\n", "yaml", "plan.yaml")
    assert plan.target_branch is None
    assert (plan.merge, plan.on_no_changes, plan.budget_usd) == ("merge", "fail", None)
    assert plan.tasks == (TaskSpec(key="only", title="Do it", prompt="Do it"),)


def test_explicit_nulls_mean_the_default() -> None:
    text = "target_branch:\nagent:\ntasks:\n  - id: a\n    title: A\n    after:\n    labels:\n"
    plan = parse_plan(text, "yaml", "plan.yaml")
    assert plan.target_branch is None
    assert plan.tasks == (TaskSpec(key="a", title="A", prompt="A"),)


def test_diamond_and_chain() -> None:
    text = yaml_tasks(
        "  - {id: top, title: T}\n"
        "  - {id: left, title: L, after: [top]}\n"
        "  - {id: right, title: R, after: [top]}\n"
        "  - {id: bottom, title: B, after: [left, right]}\n"
        "  - {id: c3, title: C, after: [c2]}\n"
        "  - {id: c2, title: C, after: [c1]}\n"
        "  - {id: c1, title: C, after: [bottom]}\n"
    )
    plan = parse_plan(text, "yaml", "plan.yaml")
    assert [t.key for t in plan.tasks] == ["top", "left", "right", "bottom", "c3", "c2", "c1"]
    assert topological_order(plan.tasks) == ["top", "left", "right", "bottom", "c1", "c2", "c3"]


def test_load_plan_by_suffix(tmp_path: Path) -> None:
    (tmp_path / "p.yml").write_text(FULL_YAML)
    (tmp_path / "p.TOML").write_text(FULL_TOML)
    assert load_plan(tmp_path / "p.yml").digest == load_plan(tmp_path / "p.TOML").digest


def test_load_plan_refuses_other_suffixes_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text("{}")
    with pytest.raises(InvalidRequest, match=r"p\.json.*\.yaml, \.yml or \.toml"):
        load_plan(tmp_path / "p.json")
    with pytest.raises(InvalidRequest, match=r"cannot read plan .*missing\.yaml"):
        load_plan(tmp_path / "missing.yaml")


# ---- syntax and shape ------------------------------------------------------------------------


def test_bad_yaml_names_the_line() -> None:
    message = refused("tasks:\n  - id: a\n    title: [unclosed\n")
    assert "invalid YAML at line" in message


def test_bad_toml_names_the_line() -> None:
    message = refused('[[tasks]]\nid = "a"\ntitle = \n', "toml")
    assert "invalid TOML" in message
    assert "line 3" in message


def test_yaml_key_given_twice_is_refused() -> None:
    message = refused("tasks:\n  - id: a\n    title: A\n    title: B\n")
    assert "duplicate key 'title'" in message
    assert "line 4" in message


def test_yaml_merge_keys_still_work() -> None:
    text = "tasks:\n  - &base {id: a, title: A, labels: [x]}\n  - {<<: *base, id: b}\n"
    assert parse_plan(text, "yaml", "p").tasks[1].labels == ("x",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "top level must be a mapping, not nothing"),
        ("- a\n- b\n", "top level must be a mapping, not list"),
        ("merge: ff\n", "tasks is missing"),
        ("tasks: []\n", "tasks must be a non-empty list"),
        ("tasks: {id: a}\n", "tasks must be a non-empty list, not dict"),
        ("tasks:\n  - just a string\n", "task #1 must be a mapping, not str"),
    ],
)
def test_shape_errors(text: str, expected: str) -> None:
    assert expected in refused(text)


def test_unknown_keys_are_listed() -> None:
    message = refused("colour: red\nsize: 3\ntasks:\n  - {id: a, title: A}\n")
    assert "unknown keys 'colour', 'size'" in message
    message = refused(yaml_tasks("  - {id: a, title: A, deps: [b], prio: 1}\n"))
    assert "task #1: unknown keys 'deps', 'prio'" in message
    assert "known: after, agent" in message


# ---- tasks -----------------------------------------------------------------------------------


def test_missing_id_and_title() -> None:
    assert "task #2 has no id" in refused(yaml_tasks("  - {id: a, title: A}\n  - {title: B}\n"))
    assert "task 'b' has no title" in refused(yaml_tasks("  - {id: b}\n"))
    assert "task 'b': title must be a non-empty string" in refused(
        yaml_tasks("  - {id: b, title: ''}\n")
    )


@pytest.mark.parametrize(
    "key",
    ["-a", ".a", "a/b", "a b", "a..b", "a.lock", "a.", "é", "x" * 65, "a:b", "a~1", "a@{1}"],
)
def test_invalid_ids(key: str) -> None:
    message = refused(yaml_tasks(f"  - {{id: '{key}', title: A}}\n"))
    assert f"invalid id {key!r}" in message


@pytest.mark.parametrize("key", ["a", "A1", "x" * 64, "fix_bug-2.v3", "1"])
def test_valid_ids(key: str) -> None:
    plan = parse_plan(yaml_tasks(f"  - {{id: '{key}', title: A}}\n"), "yaml", "p")
    assert plan.tasks[0].key == key


def test_id_must_be_a_string() -> None:
    assert "id must be a non-empty string, not int 12" in refused(
        yaml_tasks("  - {id: 12, title: A}\n")
    )


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ("priority: high", "priority must be an integer, not str"),
        ("priority: 1.5", "priority must be an integer, not float"),
        ("priority: true", "priority must be an integer, not bool"),
        ("priority: 5000", "priority must be between -1000 and 1000"),
        ("max_attempts: 0", "max_attempts must be between 1 and 100, not 0"),
        ("labels: python", "labels must be a list of non-empty strings"),
        ("labels: [a, 1]", "labels must be a list of non-empty strings"),
        ("after: b", "after must be a list of non-empty strings"),
        ("depends_on: [1]", "depends_on must be a list of non-empty strings"),
        ("budget_usd: -1", "budget_usd must be a finite number >= 0, not -1"),
        ("budget_usd: .inf", "budget_usd must be a finite number >= 0"),
        ("budget_usd: lots", "budget_usd must be a number, not str"),
        ("prompt: ' '", "prompt must be a non-empty string, not str ' '"),
        ("prompt: [x]", "prompt must be a non-empty string, not list"),
        ("agent: 3", "agent must be a non-empty string"),
        ("after: [], depends_on: []", "give after or depends_on, not both"),
    ],
)
def test_task_field_errors(fields: str, expected: str) -> None:
    message = refused(yaml_tasks(f"  - {{id: a, title: A, {fields}}}\n"))
    assert f"task 'a': {expected}" in message or f"task 'a' {expected}" in message


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        ("merge: squash\n", "merge must be one of 'merge', 'ff', not 'squash'"),
        ("on_no_changes: skip\n", "on_no_changes must be one of 'fail', 'complete', not 'skip'"),
        ("budget_usd: -0.5\n", "budget_usd must be a finite number >= 0, not -0.5"),
        ("max_attempts: 0\n", "max_attempts must be between 1 and 100"),
        ("target_branch: 7\n", "target_branch must be a non-empty string"),
    ],
)
def test_plan_field_errors(head: str, expected: str) -> None:
    assert expected in refused(yaml_tasks("  - {id: a, title: A}\n", head))


def test_toml_type_errors_too() -> None:
    message = refused('[[tasks]]\nid = "a"\ntitle = "A"\npriority = "high"\n', "toml")
    assert "task 'a': priority must be an integer" in message


# ---- the graph -------------------------------------------------------------------------------


def test_duplicate_id() -> None:
    message = refused(
        yaml_tasks("  - {id: a, title: A}\n  - {id: b, title: B}\n  - {id: a, title: C}\n")
    )
    assert "duplicate task id 'a' in task #3: task #1 has it" in message


def test_ids_that_differ_only_in_case_are_duplicates() -> None:
    message = refused(yaml_tasks("  - {id: Api, title: A}\n  - {id: api, title: B}\n"))
    assert "duplicate task id 'api' in task #2: task #1 has it as 'Api'" in message


def test_unknown_dependency() -> None:
    message = refused(yaml_tasks("  - {id: a, title: A}\n  - {id: b, title: B, after: [a, x]}\n"))
    assert "task 'b' depends on unknown task 'x'" in message


def test_self_dependency() -> None:
    assert "task 'a' depends on itself" in refused(
        yaml_tasks("  - {id: a, title: A, after: [a]}\n")
    )


def test_cycle_is_named() -> None:
    text = yaml_tasks(
        "  - {id: start, title: S}\n"
        "  - {id: a, title: A, after: [start, c]}\n"
        "  - {id: b, title: B, after: [a]}\n"
        "  - {id: c, title: C, after: [b]}\n"
        "  - {id: d, title: D, after: [c]}\n"
    )
    message = refused(text)
    assert "dependency cycle" in message
    assert "a -> c -> b -> a" in message


def test_cycle_downstream_task_is_not_in_the_path() -> None:
    with pytest.raises(InvalidRequest, match=r"cycle .*: b -> c -> b$"):
        check_graph([spec("z", "b"), spec("b", "c"), spec("c", "b")])


def test_ten_thousand_task_chain_is_read_without_recursion() -> None:
    n = 10_000
    lines = ["  - {id: t0, title: T}"]
    lines += [f"  - {{id: t{i}, title: T, after: [t{i - 1}]}}" for i in range(1, n)]
    plan = parse_plan(yaml_tasks("\n".join(lines) + "\n"), "yaml", "big.yaml")
    assert topological_order(plan.tasks[::-1]) == [f"t{i}" for i in range(n)]


def test_ten_thousand_task_cycle_is_found_without_recursion() -> None:
    n = 10_000
    specs = [spec(f"t{i}", f"t{(i - 1) % n}") for i in range(n)]
    with pytest.raises(InvalidRequest, match="dependency cycle") as info:
        check_graph(specs)
    assert info.value.message.count(" -> ") == n


def test_topological_order_respects_dependencies() -> None:
    specs = [spec("d", "b", "c"), spec("c", "a"), spec("b", "a"), spec("a"), spec("e")]
    order = topological_order(specs)
    assert sorted(order) == ["a", "b", "c", "d", "e"]
    for s in specs:
        assert all(order.index(dep) < order.index(s.key) for dep in s.after)
    assert order == ["a", "c", "b", "d", "e"]  # ties broken by position


def test_check_graph_with_known_ids() -> None:
    check_graph([spec("new", "old"), spec("newer", "new", "old")], known=["old"])
    with pytest.raises(InvalidRequest, match="task 'new' depends on unknown task 'gone'"):
        check_graph([spec("new", "gone")], known=["old"])
    with pytest.raises(InvalidRequest, match="duplicate task id 'old' in task #1: an existing"):
        check_graph([spec("old")], known=["old"])
    assert topological_order([spec("new", "old")]) == ["new"]


def test_check_graph_messages_name_the_source_when_given() -> None:
    with pytest.raises(InvalidRequest, match=r"^cli: task 'a' depends on itself$"):
        check_graph([spec("a", "a")], source="cli")
