"""``corral tasks run --dashboard``: the address it prints opens, signed in, the page of the
plan it runs, whose graph shows each task under way while its agent is held, then merged."""

from __future__ import annotations

import re
from pathlib import Path

from browser_support import DESKTOP, NETWORK_DOWN, Page, start_chromium
from tasks_helpers import TaskRepo, task, wait_for, write

RUN_TIMEOUT_S = 90.0
FIRST_MERGE = 'tr[data-task="first"] td:nth-child(4)'  # its merge commit, shortened


def test_the_printed_address_shows_the_plan_running_live(tmp_path: Path) -> None:
    tr = TaskRepo(tmp_path)
    # Each agent is held at its gate: the page is looked at while `tasks run` (and the
    # coordinator it embeds) is alive; it ends as soon as the plan is done.
    first = f"First. [fake:wait_while={tr.gates / 'first'}] " + write("first.txt", "1\n")
    second = f"Second. [fake:wait_while={tr.gates / 'second'}] " + write("second.txt", "2\n")
    plan = tr.write_plan(
        {"tasks": [task("first", prompt=first), task("second", "first", prompt=second)]}
    )
    assert tr.corral("plan", str(plan)).code == 0
    tr.close_gate("first")
    tr.close_gate("second")
    proc = tr.start("run", "--workers", "1", "--dashboard")
    driver = start_chromium(tmp_path)
    try:
        printed = wait_for(
            lambda: re.search(r"dashboard: (\S+)", tr.background_log()), what="the address"
        )
        page = Page(driver, printed[1].split("/#", 1)[0], tmp_path / "screenshots")
        page.resize(DESKTOP)
        driver.get(printed[1])
        node = 'svg.graph g.node[data-task="{}"]'.format
        page.wait_attr(node("first"), "data-status", {"claimed", "in_progress"})
        page.wait_attr(node("second"), "data-status", {"blocked"})
        assert "token" not in driver.current_url and "#/plans/prj_" in driver.current_url
        page.shot("tasks-run-under-way")
        tr.open_gate("first")
        page.wait_attr(node("first"), "data-status", {"completed"})
        page.wait_attr(node("second"), "data-status", {"claimed", "in_progress"})
        page.wait_text('tr[data-task="first"]', "corral/first")
        merge = page.wait(
            lambda d: re.fullmatch(r"[0-9a-f]{12}", page.find(FIRST_MERGE).text), "a merge"
        )
        page.shot("tasks-run-first-merged")
        tr.open_gate("second")
        assert proc.wait(timeout=RUN_TIMEOUT_S) == 0, tr.background_log()
        assert tr.tasks()["first"]["merge_commit"].startswith(merge[0])
        # Its coordinator ends with the run: only the calls made after that failed.
        errors = [e["message"] for e in page.console_errors()]
        assert [m for m in errors if not re.search(NETWORK_DOWN, m)] == []
    finally:
        driver.quit()
        tr.open_gate("first")
        tr.open_gate("second")
        tr.kill_group(proc)
