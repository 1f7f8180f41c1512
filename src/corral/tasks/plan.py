"""Plan files: a graph of dependent tasks, read from YAML (``.yaml``/``.yml``) or TOML.

    target_branch: main        # optional; default: the repository's current branch
    merge: merge               # "merge" (always a merge commit, default) or "ff" (when possible)
    on_no_changes: fail        # a task that changes nothing: "fail" (default) or "complete"
    agent: claude              # optional default agent of the tasks
    max_attempts: 3            # optional default of the tasks
    budget_usd: 10.0           # optional cost limit of a run of the plan
    tasks:
      - id: schema             # 1-64 of [A-Za-z0-9._-], starting alphanumeric: the branch
        title: Add the schema  #   is corral/<id>
        prompt: |              # default: the title
          Create db/schema.sql with ...
        after: []              # ids of the tasks this one waits for (or ``depends_on``)
        priority: 10
        labels: [python]
        agent: researcher
        max_attempts: 2
        budget_usd: 1.5

In TOML the tasks are ``[[tasks]]`` tables. Every problem is one ``InvalidRequest`` naming
the file and the problem. ``Plan.digest`` hashes the resolved content (defaults applied), so
an unchanged plan has the same digest whether it is written in YAML or TOML.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import reprlib
import tomllib
from collections.abc import Collection, Hashable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from corral.errors import InvalidRequest
from corral.tasks.model import TaskSpec
from corral.workspaces.names import check_branch, check_key

try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

MERGE_MODES = ("merge", "ff")
NO_CHANGES_MODES = ("fail", "complete")
PLAN_KEYS = frozenset(
    {"target_branch", "merge", "on_no_changes", "agent", "max_attempts", "budget_usd", "tasks"}
)
TASK_KEYS = frozenset(
    {
        "id",
        "title",
        "prompt",
        "after",
        "depends_on",
        "priority",
        "labels",
        "agent",
        "max_attempts",
        "budget_usd",
    }
)
MAX_ATTEMPTS = 100  # the bounds runs have too
# The most work a plan file may cause: its size, and what YAML aliases may make of it (a
# few hundred bytes of nested aliases expand to billions of nodes, the "billion laughs").
MAX_PLAN_BYTES = 1024 * 1024
MAX_PLAN_NODES = 100_000  # values once every alias is expanded
MAX_PLAN_CHARS = 8 * 1024 * 1024  # characters of text once every alias is expanded
MAX_PLAN_DEPTH = 32
PRIORITY_RANGE = (-1000, 1000)


@dataclass(frozen=True)
class Plan:
    tasks: tuple[TaskSpec, ...]  # in file order
    target_branch: str | None
    merge: str
    on_no_changes: str
    budget_usd: float | None
    digest: str  # sha256 of the canonical content


def load_plan(path: Path) -> Plan:
    fmts: dict[str, Literal["yaml", "toml"]] = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml"}
    fmt = fmts.get(path.suffix.lower())
    if fmt is None:
        raise InvalidRequest(f"{path}: a plan file must end in .yaml, .yml or .toml")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_PLAN_BYTES + 1)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read plan {path}: {exc}") from exc
    return parse_plan(text, fmt, str(path))


def parse_plan(text: str, fmt: Literal["yaml", "toml"], source: str) -> Plan:
    if len(text) > MAX_PLAN_BYTES or len(text.encode()) > MAX_PLAN_BYTES:
        raise _too_large(source, f"is over {MAX_PLAN_BYTES} bytes")
    data = _load_yaml(text, source) if fmt == "yaml" else _load_toml(text, source)
    if not isinstance(data, dict):
        raise InvalidRequest(f"{source}: the top level must be a mapping, not {_kind(data)}")
    _no_unknown_keys(data, PLAN_KEYS, source)
    target_branch = _opt_str(data, "target_branch", source)
    if target_branch is not None:
        check_branch(target_branch, f"{source}: target_branch: ")
    merge = _choice(data, "merge", MERGE_MODES, source)
    on_no_changes = _choice(data, "on_no_changes", NO_CHANGES_MODES, source)
    budget = _opt_budget(data, source)
    defaults = {
        "agent": _opt_str(data, "agent", source),
        "max_attempts": _opt_int(data, "max_attempts", source, 1, MAX_ATTEMPTS),
    }
    tasks = data.get("tasks")
    if tasks is None:
        raise InvalidRequest(f"{source}: tasks is missing")
    if not isinstance(tasks, list) or not tasks:
        raise InvalidRequest(f"{source}: tasks must be a non-empty list, not {_kind(tasks)}")
    specs = tuple(_parse_task(task, i, defaults, source) for i, task in enumerate(tasks, 1))
    check_graph(specs, source=source)
    content = {
        "format": "corral-plan/1",
        "target_branch": target_branch,
        "merge": merge,
        "on_no_changes": on_no_changes,
        "budget_usd": budget,
        "tasks": [asdict(spec) for spec in specs],
    }
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return Plan(specs, target_branch, merge, on_no_changes, budget, digest)


def check_graph(
    specs: Sequence[TaskSpec], known: Collection[str] = (), *, source: str = ""
) -> None:
    """Refuse duplicate ids (code ``duplicate_task``), unknown dependencies
    (``unknown_dependency``), and self dependencies and cycles (``dependency_cycle``).

    ``known`` are the ids of tasks already stored (not among ``specs``): dependencies may
    name them, new tasks may not reuse them. Ids that differ only in case count as
    duplicates, since their branches would collide on a case-insensitive file system.
    """
    prefix = f"{source}: " if source else ""
    known = set(known)
    seen = {key.casefold(): (key, "an existing task") for key in known}
    for i, spec in enumerate(specs, 1):
        key, owner = seen.setdefault(spec.key.casefold(), (spec.key, f"task #{i}"))
        if owner != f"task #{i}":
            same = "" if key == spec.key else f" as {key!r} (ids may not differ only in case)"
            raise InvalidRequest(
                f"{prefix}duplicate task id {spec.key!r} in task #{i}: {owner} has it{same}",
                code="duplicate_task",
            )
    ids = {spec.key for spec in specs}
    for spec in specs:
        for dep in spec.after:
            if dep == spec.key:
                raise InvalidRequest(
                    f"{prefix}task {spec.key!r} depends on itself", code="dependency_cycle"
                )
            if dep not in ids and dep not in known:
                raise InvalidRequest(
                    f"{prefix}task {spec.key!r} depends on unknown task {dep!r}",
                    code="unknown_dependency",
                )
    topological_order(specs, source=source)


def topological_order(specs: Sequence[TaskSpec], *, source: str = "") -> list[str]:
    """The ids, each after those it waits for; ties go in file order.

    Dependencies on ids not among ``specs`` (tasks already stored) are ignored. A cycle
    raises ``InvalidRequest`` naming it, e.g. ``a -> b -> a`` (each waits for the next).
    """
    index = {spec.key: i for i, spec in enumerate(specs)}
    waiting = [len({d for d in spec.after if d in index}) for spec in specs]
    dependents: list[list[int]] = [[] for _ in specs]
    for i, spec in enumerate(specs):
        for dep in dict.fromkeys(spec.after):
            if dep in index:
                dependents[index[dep]].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(specs[i].key)
        for j in dependents[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < len(specs):
        prefix = f"{source}: " if source else ""
        cycle = " -> ".join(_find_cycle(specs, index, waiting))
        raise InvalidRequest(
            f"{prefix}dependency cycle (each waits for the next): {cycle}",
            code="dependency_cycle",
        )
    return order


def _find_cycle(specs: Sequence[TaskSpec], index: dict[str, int], waiting: list[int]) -> list[str]:
    """Every task left waiting waits for another one left waiting: walk until one repeats."""
    path: list[str] = []
    position: dict[str, int] = {}
    key = next(spec.key for spec, count in zip(specs, waiting, strict=True) if count)
    while key not in position:
        position[key] = len(path)
        path.append(key)
        key = next(d for d in specs[index[key]].after if d in index and waiting[index[d]])
    return [*path[position[key] :], key]


def _parse_task(task: Any, number: int, defaults: dict[str, Any], source: str) -> TaskSpec:
    where = f"{source}: task #{number}"
    if not isinstance(task, dict):
        raise InvalidRequest(f"{where} must be a mapping, not {_kind(task)}")
    _no_unknown_keys(task, TASK_KEYS, where)
    key = _opt_str(task, "id", where)
    if key is None:
        raise InvalidRequest(f"{where} has no id")
    check_key(key, f"{where}: ")
    where = f"{source}: task {key!r}"
    title = _opt_str(task, "title", where)
    if title is None:
        raise InvalidRequest(f"{where} has no title")
    if task.get("after") is not None and task.get("depends_on") is not None:
        raise InvalidRequest(f"{where}: give after or depends_on, not both")
    after_key = "depends_on" if task.get("depends_on") is not None else "after"
    agent = _opt_str(task, "agent", where)
    max_attempts = _opt_int(task, "max_attempts", where, 1, MAX_ATTEMPTS)
    return TaskSpec(
        key=key,
        title=title,
        prompt=_opt_str(task, "prompt", where) or title,
        after=tuple(dict.fromkeys(_str_list(task, after_key, where))),
        priority=_opt_int(task, "priority", where, *PRIORITY_RANGE) or 0,
        labels=_str_list(task, "labels", where),
        agent=agent if agent is not None else defaults["agent"],
        max_attempts=max_attempts or defaults["max_attempts"] or TaskSpec.max_attempts,
        budget_usd=_opt_budget(task, where),
    )


# ---- values: an absent key and an explicit null both mean "the default" ----------------------


def _opt_str(table: dict[Any, Any], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise InvalidRequest(f"{where}: {key} must be a non-empty string, not {_kind(value)}")
    return value


def _opt_int(table: dict[Any, Any], key: str, where: str, low: int, high: int) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{where}: {key} must be an integer, not {_kind(value)}")
    if not low <= value <= high:
        raise InvalidRequest(f"{where}: {key} must be between {low} and {high}, not {value}")
    return value


def _opt_budget(table: dict[Any, Any], where: str) -> float | None:
    value = table.get("budget_usd")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{where}: budget_usd must be a number, not {_kind(value)}")
    if not math.isfinite(value) or value < 0:
        raise InvalidRequest(f"{where}: budget_usd must be a finite number >= 0, not {value}")
    return float(value)


def _str_list(table: dict[Any, Any], key: str, where: str) -> tuple[str, ...]:
    value = table.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InvalidRequest(f"{where}: {key} must be a list of non-empty strings")
    return tuple(value)


def _choice(table: dict[Any, Any], key: str, allowed: tuple[str, ...], where: str) -> str:
    value = table.get(key)
    if value is None:
        return allowed[0]
    if value not in allowed:
        raise InvalidRequest(
            f"{where}: {key} must be one of {', '.join(map(repr, allowed))}, not {_excerpt(value)}"
        )
    return str(value)


def _no_unknown_keys(table: dict[Any, Any], allowed: frozenset[str], where: str) -> None:
    unknown = [_excerpt(key) for key in table if key not in allowed]
    if unknown:
        raise InvalidRequest(
            f"{where}: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(allowed))})"
        )


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {_excerpt(value)}"


def _excerpt(value: Any) -> str:
    """A bounded repr: a value may be huge, or share parts with itself many times over."""
    return _EXCERPT.repr(value)


def _make_excerpt() -> reprlib.Repr:
    excerpt = reprlib.Repr()
    excerpt.maxlevel, excerpt.maxlist, excerpt.maxdict = 2, 4, 4
    excerpt.maxstring = excerpt.maxother = excerpt.maxlong = 40
    return excerpt


_EXCERPT = _make_excerpt()


def _too_large(source: str, what: str) -> InvalidRequest:
    return InvalidRequest(f"{source}: the plan {what}", code="plan_too_large")


# ---- syntax ----------------------------------------------------------------------------------


class _StrictLoader(_SafeLoader):
    """``yaml.safe_load`` that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # the base class refuses it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {_excerpt(key)}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def _load_yaml(text: str, source: str) -> Any:
    loader = _StrictLoader(text)  # a safe loader
    try:
        node = loader.get_single_node()  # aliases are shared nodes here: nothing expanded yet
        if node is None:
            return None
        _check_bounds(node, source)
        return loader.construct_document(node)
    except RecursionError as exc:
        raise _too_large(source, "is nested too deeply") from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InvalidRequest(f"{source}: invalid YAML{at}: {exc.problem or exc}") from exc
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer of 5,000 digits
        raise InvalidRequest(f"{source}: invalid YAML: {exc}") from exc
    finally:
        loader.dispose()


def _check_bounds(root: yaml.Node, source: str) -> None:
    """Walk the document as it would be once aliases are expanded, and stop as soon as it
    is larger or deeper than any plan needs."""
    nodes, chars = 0, 0
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_PLAN_NODES:
            raise _too_large(source, f"has over {MAX_PLAN_NODES} values (aliases expanded)")
        if depth > MAX_PLAN_DEPTH:
            raise _too_large(source, f"is nested over {MAX_PLAN_DEPTH} levels deep")
        if isinstance(node, yaml.ScalarNode):
            chars += len(node.value)
            if chars > MAX_PLAN_CHARS:
                raise _too_large(source, f"has over {MAX_PLAN_CHARS} characters (aliases expanded)")
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack += [(key, depth + 1), (value, depth + 1)]


def _load_toml(text: str, source: str) -> Any:
    try:
        return tomllib.loads(text)
    except RecursionError as exc:
        raise _too_large(source, "is nested too deeply") from exc
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise InvalidRequest(f"{source}: invalid TOML: {exc}") from exc
