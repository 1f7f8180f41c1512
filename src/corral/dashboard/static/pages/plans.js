// Task plans: every project's plan, and one plan drawn as its graph with each task's live
// state, branch and merge commit; retry, cancel, pause, resume.

import { get, post } from "../api.js";
import { actionButton, changes, firstLine, h, money, replace, runLink, table } from "../dom.js";
import { watch } from "../live.js";
import { graph } from "./graph.js";

const RETRYABLE = new Set(["failed", "merge_conflict", "cancelled"]);
const SETTLED = new Set(["completed", "blocked_by_failure", ...RETRYABLE]);

export function render(main, { view, id }) {
  return view === "one" ? one(main, id) : list(main);
}

function list(main) {
  const rows = h("div");
  const changed = changes();
  const refresh = async () => {
    const { projects } = await get("/projects");
    if (!changed(projects)) return;
    replace(
      rows,
      projects.length
        ? table(
            "Plans",
            ["Plan", "Repository", "Branch", "Tasks", "Cost", "State"],
            projects.map((p) =>
              h(
                "tr",
                { "data-project-id": p.project_id },
                h("td", {}, h("a", { href: `#/plans/${encodeURIComponent(p.project_id)}` }, p.project_id)),
                h("td", {}, h("code", {}, p.repo_path)),
                h("td", {}, p.target_branch),
                h("td", {}, counts(p.counts)),
                h("td", { class: "num" }, money(p.cost_usd)),
                h("td", {}, p.paused ? `paused (${p.pause_reason || "by the user"})` : "running"),
              ),
            ),
          )
        : h("p", {}, "No plans yet: ", h("code", {}, "corral tasks plan plan.yaml"), " imports one."),
    );
  };
  replace(main, h("h1", {}, "Task plans"), rows);
  return watch(["task", "plan", "project"], refresh);
}

function counts(found = {}) {
  const parts = Object.entries(found).map(([status, n]) => `${n} ${status.replaceAll("_", " ")}`);
  return parts.join(", ") || "—";
}

function one(main, id) {
  const base = `/projects/${encodeURIComponent(id)}`;
  const summary = h("p", { role: "status", class: "plan-summary" });
  const actions = h("div", { class: "actions" });
  const picture = h("div", { class: "graph-wrap", role: "region", "aria-label": "Task graph", tabindex: "0" });
  const rows = h("div");
  const changed = changes();
  const refresh = async () => {
    const { project, tasks } = await get(`${base}/tasks`);
    if (!changed([project, tasks])) return;
    summary.textContent = `${tasks.length} tasks into ${project.target_branch}: ${counts(project.counts)}; cost ${money(project.cost_usd)}${project.budget_usd ? ` of ${money(project.budget_usd)}` : ""}; ${project.paused ? `paused (${project.pause_reason || "by the user"})` : "not paused"}`;
    replace(
      actions,
      project.paused
        ? actionButton("Resume plan", `Resume plan ${id}`, async () => (await post(`${base}/resume`), refresh()))
        : actionButton("Pause plan", `Pause plan ${id}`, async () => (await post(`${base}/pause`), refresh())),
    );
    replace(picture, graph(tasks, (key) => document.getElementById(`task-${key}`)?.focus()));
    replace(rows, table("Tasks", ["Task", "State", "Branch", "Merge commit", "Attempts", "Cost", "Run", "Actions"], tasks.map((task) => row(task, base, refresh))));
  };
  replace(main, h("h1", {}, "Plan ", h("code", {}, id)), summary, actions, picture, h("h2", {}, "Tasks"), rows);
  return watch(["task", "plan", "project", "run"], refresh);
}

function row(task, base, refresh) {
  const act = (verb) => async () => {
    await post(`${base}/tasks/${encodeURIComponent(task.id)}/${verb}`);
    await refresh();
  };
  return h(
    "tr",
    { id: `task-${task.id}`, tabindex: "-1", "data-task": task.id, "data-status": task.status },
    h("td", {}, h("strong", {}, task.id), h("br"), h("small", {}, firstLine(task.title, 80)), task.last_error ? h("small", { class: "error" }, h("br"), firstLine(task.last_error, 120)) : null),
    h("td", {}, h("span", { class: `badge t-${task.status}` }, task.status.replaceAll("_", " "))),
    h("td", {}, h("code", {}, task.branch)),
    h("td", {}, task.merge_commit ? h("code", { title: task.merge_commit }, task.merge_commit.slice(0, 12)) : "—"),
    h("td", { class: "num" }, `${task.attempts}/${task.max_attempts}`),
    h("td", { class: "num" }, money(task.cost_usd)),
    h("td", {}, task.run_id ? runLink(task.run_id) : "—"),
    h(
      "td",
      { class: "actions" },
      actionButton("Retry", `Retry task ${task.id}`, act("retry"), { disabled: !RETRYABLE.has(task.status) }),
      actionButton("Cancel", `Cancel task ${task.id}`, act("cancel"), { danger: true, disabled: SETTLED.has(task.status) }),
    ),
  );
}
