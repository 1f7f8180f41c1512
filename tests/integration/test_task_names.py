"""Task ids and target branches are checked by one function, whichever way they come: a plan
file or the REST API (on SQLite and PostgreSQL). Ids and branches that git would read as
options or paths (``-b evil``, ``--upload-pack=…``, ``../../x``) are refused with a stable
code before anything is stored, and the branch check agrees with git's own."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from api_fixtures import Api, error_code, running_api

from corral.coordinator.settings import CoordinatorSettings
from corral.errors import InvalidRequest
from corral.tasks.plan import parse_plan
from corral.workspaces.names import check_branch

BAD_BRANCHES = [
    "-b evil",
    "--upload-pack=touch /tmp/pwned",
    "-",
    "../../x",
    "a..b",
    "a b",
    "a\tb",
    "x.lock",
    ".hidden",
    "a//b",
    "a/",
    "/a",
    "a.",
    "a@{1}",
    "@",
    "HEAD",
    "a:b",
    "a~1",
    "a^",
    "a?",
    "a*",
    "a[",
    "a\\b",
    "x" * 256,
]
# git takes these (``@`` is the current branch); corral does not.
STRICTER_THAN_GIT = {"@", "HEAD", "x" * 256}
GOOD_BRANCHES = ["main", "feature/x", "release-1.2", "é-ünï", "a.b/c_d", "x" * 255]
BAD_IDS = ["../../x", "-b", "--upload-pack=x", "a/b", ".a", "a..b", "a.lock", "x" * 65]


@pytest.fixture
def settings(db_url: str) -> CoordinatorSettings:
    return CoordinatorSettings(db_url=db_url)


def git_accepts(branch: str) -> bool:
    proc = subprocess.run(
        ["git", "check-ref-format", "--branch", branch], capture_output=True, check=False
    )
    return proc.returncode == 0 and not branch.startswith("-")


@pytest.mark.parametrize("branch", BAD_BRANCHES + GOOD_BRANCHES)
def test_the_branch_check_agrees_with_git(branch: str) -> None:
    try:
        check_branch(branch)
        accepted = True
    except InvalidRequest as exc:
        assert exc.code == "invalid_branch"
        accepted = False
    assert accepted == (branch in GOOD_BRANCHES)
    assert accepted == git_accepts(branch) or branch in STRICTER_THAN_GIT


def plan_text(branch: str = "main", key: str = "a") -> str:
    return f"target_branch: {branch!r}\ntasks:\n  - {{id: {key!r}, title: A}}\n"


@pytest.mark.parametrize("branch", BAD_BRANCHES)
def test_a_plan_file_refuses_a_bad_branch(branch: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_plan(plan_text(branch=branch.replace("'", "''")), "yaml", "plan.yaml")
    assert caught.value.code == "invalid_branch"


@pytest.mark.parametrize("key", BAD_IDS)
def test_a_plan_file_refuses_a_bad_id(key: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_plan(plan_text(key=key), "yaml", "plan.yaml")
    assert caught.value.code == "invalid_task_id"


async def projects(api: Api) -> list[dict[str, Any]]:
    response = await api.client.get("/projects")
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["projects"]
    return found


@pytest.mark.anyio
async def test_the_api_refuses_the_same_branches(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        for branch in BAD_BRANCHES:
            response = await api.client.post(
                "/projects", json={"repo_path": "/r", "target_branch": branch}
            )
            assert response.status_code == 422, (branch, response.text)
            assert error_code(response) == "invalid_branch"
        assert await projects(api) == []
        for branch in GOOD_BRANCHES:
            response = await api.client.post(
                "/projects", json={"repo_path": "/r", "target_branch": branch}
            )
            assert response.status_code == 200, (branch, response.text)
        assert sorted(p["target_branch"] for p in await projects(api)) == sorted(GOOD_BRANCHES)


@pytest.mark.anyio
async def test_the_api_refuses_the_same_task_ids(settings: CoordinatorSettings) -> None:
    async with running_api(settings) as api:
        created = await api.client.post("/projects", json={"repo_path": "/r", "target_branch": "m"})
        pid = created.json()["project_id"]
        for key in BAD_IDS:
            response = await api.client.post(
                f"/projects/{pid}/tasks",
                json={"tasks": [{"id": "ok", "title": "fine"}, {"id": key, "title": "bad"}]},
            )
            assert response.status_code == 422, (key, response.text)
            assert error_code(response) == "invalid_task_id"
        listed = await api.client.get(f"/projects/{pid}/tasks")
        assert listed.json()["tasks"] == []
