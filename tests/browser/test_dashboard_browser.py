"""The dashboard in a real headless Chromium, on a real coordinator and runner: pages load
with no console errors at desktop and phone widths; runs appear and finish on screen without
a reload; log lines stream in; the cancel, drain and task buttons work; the plan's graph
shows its tasks' states as they change."""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path

from browser_support import DESKTOP, NETWORK_DOWN, PHONE, WEBSOCKET, Page
from e2e_support import TOKEN, Cluster, Runner
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from corral.dashboard.site import address

PAGES = {
    "/runs": "Runs",
    "/sessions": "Sessions",
    "/plans": "Task plans",
    "/runners": "Runners",
    "/actors": "Actors",
    "/charts": "Charts",
}
ROOT = Path(__file__).resolve().parents[2]


def command_run(cluster: Cluster, script: str) -> str:
    run_id: str = cluster.client.create_run(type="command", command=["sh", "-c", script])["run_id"]
    return run_id


def test_every_page_loads_without_console_errors_on_a_desktop_and_a_phone(
    cluster: Cluster, page: Page
) -> None:
    done = command_run(cluster, "echo hello")
    cluster.wait_run(done)
    failed = command_run(cluster, "echo oops >&2; exit 3")
    cluster.wait_run(failed)
    cancelled = command_run(cluster, "sleep 60")
    cluster.wait_run(cancelled, {"running"})
    cluster.client.cancel_run(cancelled)
    cluster.wait_run(cancelled)
    running = command_run(cluster, "echo working; sleep 60")
    cluster.wait_run(running, {"running"})
    for size, label in ((DESKTOP, "desktop"), (PHONE, "phone")):
        page.resize(size)
        for path, title in PAGES.items():
            page.go(path)
            page.wait_text("h1", title)
            if path == "/runs":
                page.wait_attr(f'tr[data-run-id="{failed}"]', "data-status", {"failed"})
            if path == "/runners":
                page.wait_for('tr[data-state="active"]')
            if path == "/charts":
                page.wait_for("figure.chart svg rect.bar")
                assert page.clipped_chart_labels() == []
            page.shot(f"{label}{path.replace('/', '-')}")
            assert not page.overflows_sideways(), f"{path} is wider than a {label} window"
        page.go(f"/runs/{failed}")
        page.wait_text("#run-log", "oops")
        page.wait_text("#log-state", "ended: failed")
        page.shot(f"{label}-run")
        assert not page.overflows_sideways()
    assert page.console_errors() == []


def test_a_run_created_through_the_api_appears_and_completes_without_a_reload(
    cluster: Cluster, page: Page, tmp_path: Path
) -> None:
    page.mark()
    go = tmp_path / "go"
    run_id = command_run(cluster, f'echo started; while [ ! -e "{go}" ]; do sleep 0.05; done')
    row = f'tr[data-run-id="{run_id}"]'
    page.wait_attr(row, "data-status", {"running"})
    page.shot("run-running")
    go.touch()
    page.wait_attr(row, "data-status", {"completed"})
    page.shot("run-completed")
    assert page.still_same_document()
    assert cluster.client.get_run(run_id)["status"] == "completed"
    assert page.console_errors() == []


def test_log_lines_stream_into_a_running_runs_page(
    cluster: Cluster, page: Page, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    script = (
        f'echo first line; while [ ! -e "{go}" ]; do sleep 0.05; done; '
        "echo second line; echo to stderr >&2"
    )
    run_id = command_run(cluster, script)
    page.go(f"/runs/{run_id}")
    page.wait_text("#run-log", "first line")
    page.wait_attr(".run-status", "data-status", {"running"})
    assert "second line" not in page.find("#run-log").text
    page.mark()
    go.touch()
    page.wait_text("#run-log", "second line")
    page.wait_text("#run-log .stderr", "to stderr")
    page.wait_attr(".run-status", "data-status", {"completed"})
    page.wait_text("#log-state", "ended: completed")
    page.shot("run-logs")
    assert page.still_same_document()
    assert page.find("#run-log").text.splitlines() == ["first line", "second line", "to stderr"]
    assert page.console_errors() == []


def test_a_lost_run_shows_it_waits_for_its_runner_and_may_be_cancelled(
    cluster: Cluster, page: Page
) -> None:
    """Its runner stopped (SIGSTOP) past its lost threshold holding the run's only attempt:
    the run's page shows it lost, waiting for that runner's report (not failed), and its
    Cancel button ends it."""
    run_id = cluster.client.create_run(
        type="command", command=["sh", "-c", "echo started; sleep 120"], max_attempts=1
    )["run_id"]
    page.go(f"/runs/{run_id}")
    page.wait_text("#run-log", "started")
    (runner,) = [p for p in cluster.procs if isinstance(p, Runner)]
    runner.send(signal.SIGSTOP)
    try:
        page.wait_attr(".run-status", "data-status", {"lost"})
        said = page.wait_text(".run-status", "for its runner to report the attempt").text
        assert "waiting until " in said  # the grace's end (``lost_until``)
        page.shot("run-lost")
        page.click(f'button[aria-label="Cancel run {run_id}"]')
        page.wait_attr(".run-status", "data-status", {"cancelled"})
    finally:
        runner.send(signal.SIGCONT)
    assert cluster.client.get_run(run_id)["status"] == "cancelled"
    assert page.console_errors() == []


def test_the_cancel_button_stops_a_running_run_and_retry_starts_it_again(
    cluster: Cluster, page: Page
) -> None:
    run_id = command_run(cluster, "echo waiting; sleep 60")
    page.go(f"/runs/{run_id}")
    page.wait_text("#run-log", "waiting")
    page.click(f'button[aria-label="Cancel run {run_id}"]')
    page.wait_attr(".run-status", "data-status", {"cancelled"})
    assert cluster.client.get_run(run_id)["status"] == "cancelled"
    # The page redraws its buttons as the run changes: read the one on the page now.
    cancel = f'button[aria-label="Cancel run {run_id}"]'
    page.wait(lambda _: not page.find(cancel).is_enabled(), "the Cancel button disabled")
    page.shot("run-cancelled")

    page.click(f'button[aria-label="Retry run {run_id} as a new run"]')
    page.wait(lambda d: run_id not in d.execute_script("return location.hash"), "the new run")
    retried = page.driver.execute_script("return location.hash").rsplit("/", 1)[1]
    page.wait_text("#run-log", "waiting")
    assert cluster.client.get_run(retried)["command"] == ["sh", "-c", "echo waiting; sleep 60"]
    cluster.client.cancel_run(retried)
    assert page.console_errors() == []


def test_the_drain_and_stop_buttons_take_runners_out(cluster: Cluster, page: Page) -> None:
    cluster.start_runner("runner-b", extra=WEBSOCKET)
    ids = {r["name"]: r["runner_id"] for r in cluster.client.runners()}
    page.go("/runners")
    row = 'tr[data-runner-id="{}"]'.format
    for name in ("runner-a", "runner-b"):
        page.wait_attr(row(ids[name]), "data-state", {"active"})
    page.wait_text(row(ids["runner-a"]), "websocket")
    page.shot("runners-active")

    page.click('button[aria-label="Drain runner runner-a"]')
    # An idle runner drained leaves at once: it may show draining first, then stopped.
    page.wait_attr(row(ids["runner-a"]), "data-state", {"stopped"})
    assert cluster.runner_by_id(ids["runner-a"])["state"] == "stopped"
    page.click('button[aria-label="Stop runner runner-b"]')
    page.wait_attr(row(ids["runner-b"]), "data-state", {"stopped"})
    assert cluster.runner_by_id(ids["runner-b"])["state"] == "stopped"
    stop = 'button[aria-label="Stop runner runner-b"]'  # redrawn as the list refreshes
    page.wait(lambda _: not page.find(stop).is_enabled(), "runner-b's Stop button disabled")
    page.shot("runners-stopped")
    assert page.console_errors() == []


def test_the_plan_page_draws_the_graph_with_each_tasks_live_state(
    cluster: Cluster, page: Page, tmp_path: Path
) -> None:
    # A plan that is never started (no workers): its tasks wait, and the buttons move them.
    project = cluster.client.call(
        "POST", "/projects", json={"repo_path": str(tmp_path), "target_branch": "main"}
    )
    pid = project["project_id"]
    tasks = [
        {"id": "schema", "title": "Add the schema"},
        {"id": "api", "title": "Add the API", "after": ["schema"]},
        {"id": "cli", "title": "Add the CLI", "after": ["schema"]},
        {"id": "docs", "title": "Write the docs", "after": ["api", "cli"]},
    ]
    cluster.client.call("POST", f"/projects/{pid}/tasks", json={"tasks": tasks})
    page.go(f"/plans/{pid}")
    node = 'svg.graph g.node[data-task="{}"]'.format
    page.wait_attr(node("schema"), "data-status", {"ready"})
    for key in ("api", "cli", "docs"):
        page.wait_attr(node(key), "data-status", {"blocked"})
    page.wait_text('tr[data-task="api"]', "corral/api")
    page.shot("plan-waiting")

    page.click('button[aria-label="Cancel task schema"]')
    page.wait_attr(node("schema"), "data-status", {"cancelled"})
    for key in ("api", "cli", "docs"):
        page.wait_attr(node(key), "data-status", {"blocked_by_failure"})
    page.shot("plan-cancelled")

    page.click('button[aria-label="Retry task schema"]')
    page.wait_attr(node("schema"), "data-status", {"ready"})
    page.wait_attr(node("docs"), "data-status", {"blocked"})
    page.click(f'button[aria-label="Pause plan {pid}"]')
    page.wait_text(".plan-summary", "; paused (")  # not the "not paused" shown before
    assert cluster.client.call("GET", f"/projects/{pid}")["paused"] is True
    assert page.console_errors() == []


def test_signing_in_with_the_form_or_the_address_the_cli_prints(
    cluster: Cluster, page: Page
) -> None:
    driver = page.driver
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{cluster.url}/")
    field = page.wait_for("#token-input")
    assert page.find('label[for="token-input"]').text == "Token"
    assert driver.switch_to.active_element == field  # the keyboard is there at once
    field.send_keys("crl_not-a-token", Keys.ENTER)
    page.wait_text("#token-why", "That token was refused")
    page.shot("sign-in-refused")
    page.find("#token-input").send_keys(TOKEN, Keys.ENTER)
    page.wait_text("h1", "Runs")
    assert "token" not in driver.current_url

    # What `corral tasks run --dashboard` prints: signed in, on the plan's page.
    driver.execute_script("sessionStorage.clear()")
    driver.get(address(cluster.url, TOKEN, page="/runners"))
    page.wait_text("h1", "Runners")
    assert driver.current_url == f"{cluster.url}/#/runners"
    # The skip link comes first for the keyboard, and leads to the page's content.
    driver.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)
    assert driver.switch_to.active_element.text == "Skip to content"
    # Refused calls were answered 401, which the console lists; nothing else went wrong.
    errors = [e["message"] for e in page.console_errors()]
    assert all("401" in message for message in errors), errors


def test_the_open_pages_go_on_across_a_coordinator_restart(
    cluster: Cluster, page: Page, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    script = f'echo before; while [ ! -e "{go}" ]; do sleep 0.05; done; echo after'
    run_id = command_run(cluster, script)
    page.go(f"/runs/{run_id}")
    page.wait_text("#run-log", "before")
    page.mark()
    cluster.restart_coordinator()  # SIGKILL, then the same port and database
    go.touch()
    page.wait_text("#run-log", "after")
    page.wait_attr(".run-status", "data-status", {"completed"})
    # Every stored line once, in order (a restart may cost the run an attempt: the runner's
    # lease can run out while the coordinator is down; the page marks where each begins).
    shown = page.find("#run-log").text.splitlines()
    stored = cluster.client.logs(run_id)["lines"]
    assert [line for line in shown if not line.startswith("── attempt")] == [
        line["text"] for line in stored
    ]
    assert shown[-2:] == ["before", "after"]
    later = command_run(cluster, "echo later")
    page.go("/runs")
    page.wait_attr(f'tr[data-run-id="{later}"]', "data-status", {"completed"})
    assert page.still_same_document()
    # Only the calls made while the coordinator was down failed.
    errors = [e["message"] for e in page.console_errors()]
    assert errors and all(re.search(NETWORK_DOWN, m) for m in errors), errors


def test_the_actors_page_wakes_puts_to_sleep_and_destroys_an_actor(
    cluster: Cluster, page: Page
) -> None:
    config = cluster.root / "actors.toml"
    command = json.dumps([sys.executable, str(ROOT / "examples" / "agent_actor.py")])
    config.write_text(f"[actors.agent]\ncommand = {command}\n")
    cluster.start_runner("actor-host", extra=[*WEBSOCKET, "--config", str(config)])
    actor = cluster.client.call("POST", "/actors", json={"name": "agent", "key": "k1"})
    row = f'tr[data-actor-id="{actor["actor_id"]}"]'
    page.go("/actors")
    page.wait_attr(row, "data-state", {"running"})
    page.wait_text('tr[data-pool="default"]', "1 running")
    page.shot("actors-running")

    # Changes made elsewhere arrive as actor and pool events: the page shows them.
    cluster.client.call("POST", f"/actors/{actor['actor_id']}/sleep")
    page.wait_attr(row, "data-state", {"sleeping"})
    body = {"serverless": {"url": "http://127.0.0.1:9", "min_runners": 0, "max_runners": 2}}
    cluster.client.call("PUT", "/pools/gpu", json=body)
    page.wait_attr('tr[data-pool="gpu"]', "data-desired", {"0"})
    page.wait_text('tr[data-pool="gpu"]', "http://127.0.0.1:9")
    page.shot("actors-sleeping-and-pools")
    page.click('button[aria-label="Wake actor agent k1"]')
    page.wait_attr(row, "data-state", {"running"})
    page.click('button[aria-label="Destroy actor agent k1"]')
    page.wait(lambda d: not d.find_elements(By.CSS_SELECTOR, row), "the actor to leave the list")
    destroyed = cluster.client.call("GET", f"/actors/{actor['actor_id']}")
    assert destroyed["state"] == "destroyed"
    assert page.console_errors() == []


def test_a_session_is_started_and_resumed_from_its_pages(cluster: Cluster, page: Page) -> None:
    page.go("/sessions")
    page.click("details.panel summary")
    page.wait_for('select[name="agent_name"] option[value="claude"]')
    page.find('input[name="session_name"]').send_keys("demo")
    page.find('textarea[name="prompt"]').send_keys("hello [fake:cost=0.0375]")
    page.find('form[aria-label="Start a session"] button[type="submit"]').click()
    page.wait_attr(".run-status", "data-status", {"completed"})
    page.click('dl.facts a[href^="#/sessions/"]')
    page.wait_text("pre.result", "hello")
    page.wait_text("dl.facts", "$0.0375")

    page.find('form[aria-label="Resume this session"] textarea').send_keys(
        "more [fake:cost=0.0125]"
    )
    page.find('form[aria-label="Resume this session"] button[type="submit"]').click()
    page.wait_attr(".run-status", "data-status", {"completed"})
    page.click('dl.facts a[href^="#/sessions/"]')
    page.wait_text("dl.facts", "$0.0500")
    page.wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-run-id]")) == 2, "2 runs")
    page.wait_text("pre.result", "more")
    page.shot("session")
    (session,) = cluster.client.call("GET", "/sessions")["sessions"]
    assert (session["session_name"], session["runs"]) == ("demo", 2)
    assert page.console_errors() == []


def test_the_pages_follow_the_event_stream_and_resume_it_after_a_restart(
    cluster: Cluster, page: Page
) -> None:
    state = page.wait_text("#live-state", "live")
    assert state.text == "live"  # the event stream, not polling
    page.mark()
    run_id = command_run(cluster, "echo streamed")
    page.wait_attr(f'tr[data-run-id="{run_id}"]', "data-status", {"completed"})
    cluster.restart_coordinator()  # SIGKILL, then the same port and database
    page.wait(lambda d: d.find_element(By.ID, "live-state").text == "live", "the stream back")
    after = command_run(cluster, "echo after the restart")
    page.wait_attr(f'tr[data-run-id="{after}"]', "data-status", {"completed"})
    assert page.still_same_document()
    errors = [e["message"] for e in page.console_errors()]
    assert all(re.search(NETWORK_DOWN, m) for m in errors), errors


def test_a_reader_token_sees_everything_and_its_refused_actions_say_why(
    cluster: Cluster, page: Page
) -> None:
    reader = cluster.client.call("POST", "/tokens", json={"role": "reader", "name": "viewer"})
    # A fresh load, as the address is opened: from the dashboard itself only the fragment
    # would change, and the page would not load again.
    page.driver.get("about:blank")
    # The reader's token in the address replaces the admin's the tab kept; what the pages
    # before logged is not this test's.
    page.console_errors()
    page.console.clear()
    page.driver.get(address(cluster.url, reader["token"], page="/runners"))
    (runner,) = cluster.client.runners()
    row = f'tr[data-runner-id="{runner["runner_id"]}"]'
    page.wait_attr(row, "data-state", {"active"})
    page.click('button[aria-label="Drain runner runner-a"]')
    page.wait_text("#toasts .toast.error", "cannot do this")
    page.shot("reader-refused")
    assert cluster.runner_by_id(runner["runner_id"])["state"] == "active"  # nothing changed
    # Chromium may log the refused request a moment after the page showed the refusal.
    page.wait(
        lambda _: any("403" in e["message"] for e in page.console_errors()),
        "the browser to log the refused request",
    )
    errors = [e["message"] for e in page.console_errors()]
    assert errors and all("403" in message for message in errors), errors
