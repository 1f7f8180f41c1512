"""Projects in the store: a repository and the branch its plan merges into, with settings."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from corral.errors import InvalidRequest, NotFound
from corral.ids import new_project_id
from corral.store.db import Database, Row
from corral.store.rows import dumps, row_by_id, update_row
from corral.tasks.model import Project


class ProjectStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def ensure(
        self,
        repo_path: str,
        target_branch: str,
        now: float,
        *,
        merge_strategy: str | None = None,
        on_no_changes: str | None = None,
        setup_command: Sequence[str] | None = None,
        budget_usd: float | None = None,
        retry_backoff_s: float | None = None,
        resolve_conflicts: bool | None = None,
    ) -> Project:
        """The project of this repository and branch, created on first use; settings given
        here replace the stored ones."""
        if merge_strategy not in (None, "merge", "ff"):
            raise InvalidRequest(f"merge must be 'merge' or 'ff', not {merge_strategy!r}")
        if on_no_changes not in (None, "fail", "complete"):
            raise InvalidRequest(
                f"on_no_changes must be 'fail' or 'complete', not {on_no_changes!r}"
            )
        with self.db.transaction() as tx:
            row = tx.one(
                "SELECT * FROM projects WHERE repo_path = ? AND target_branch = ? "
                + self.db.lock_rows(),
                (repo_path, target_branch),
            )
            if row is None:
                pid = new_project_id()
                tx.execute(
                    "INSERT INTO projects (id, repo_path, target_branch, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (pid, repo_path, target_branch, now, now),
                )
            else:
                pid = row["id"]
            changes: dict[str, Any] = {
                "merge_strategy": merge_strategy,
                "on_no_changes": on_no_changes,
                "setup_command": dumps(list(setup_command)) if setup_command else None,
                "budget_usd": budget_usd,
                "retry_backoff_s": retry_backoff_s,
                "resolve_conflicts": None if resolve_conflicts is None else int(resolve_conflicts),
            }
            given = {k: v for k, v in changes.items() if v is not None}
            if given:
                update_row(tx, "projects", pid, now, **given)
            return project_from_row(row_by_id(tx, "projects", pid))

    def get(self, project_id: str) -> Project:
        with self.db.transaction(write=False) as tx:
            return project_from_row(row_by_id(tx, "projects", project_id))

    def find(self, repo_path: str, target_branch: str | None = None) -> Project:
        with self.db.transaction(write=False) as tx:
            sql = "SELECT * FROM projects WHERE repo_path = ?"
            params: list[Any] = [repo_path]
            if target_branch:
                sql += " AND target_branch = ?"
                params.append(target_branch)
            rows = tx.execute(sql + " ORDER BY updated_at DESC", params)
        if not rows:
            raise NotFound.of(
                "project", f"{repo_path}{'@' + target_branch if target_branch else ''}"
            )
        return project_from_row(rows[0])

    def list(self) -> list[Project]:
        with self.db.transaction(write=False) as tx:
            rows = tx.execute("SELECT * FROM projects ORDER BY updated_at DESC")
        return [project_from_row(r) for r in rows]


def project_from_row(row: Row) -> Project:
    return Project(
        id=row["id"],
        repo_path=row["repo_path"],
        target_branch=row["target_branch"],
        merge_strategy=row["merge_strategy"],
        on_no_changes=row["on_no_changes"],
        setup_command=tuple(json.loads(row["setup_command"])) if row["setup_command"] else None,
        workers=row["workers"],
        paused=bool(row["paused"]),
        pause_reason=row["pause_reason"],
        budget_usd=row["budget_usd"],
        cost_usd=row["cost_usd"],
        retry_backoff_s=row["retry_backoff_s"],
        resolve_conflicts=bool(row["resolve_conflicts"]),
        plan_digest=row["plan_digest"],
    )
