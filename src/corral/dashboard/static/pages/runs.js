// Runs: a table of the newest runs, filtered by status and by any text, kept live.

import { get, query } from "../api.js";
import { badge, changes, duration, field, firstLine, h, money, replace, runDuration, runLink, table, when } from "../dom.js";
import { watch } from "../live.js";

const STATUSES = ["pending", "claimed", "running", "completed", "failed", "cancelled", "timed_out", "lost"];
const LIMIT = 100;

export function render(main) {
  const status = h("select", { id: "runs-status", name: "status" }, h("option", { value: "" }, "any"), STATUSES.map((s) => h("option", { value: s }, s.replace("_", " "))));
  const text = h("input", { id: "runs-text", name: "text", type: "search", placeholder: "id, command, agent, runner…" });
  const count = h("p", { class: "muted", role: "status" });
  const rows = h("div");
  let runs = [];
  const changed = changes();

  const show = () => {
    const wanted = text.value.trim().toLowerCase();
    const shown = wanted ? runs.filter((run) => searchable(run).includes(wanted)) : runs;
    count.textContent = `${shown.length} of the newest ${runs.length} runs${status.value ? ` that are ${status.value.replace("_", " ")}` : ""}`;
    replace(rows, table("Runs", ["Run", "Status", "What", "Runner", "Attempts", "Cost", "Created", "Took"], shown.map(row)));
  };
  const refresh = async () => {
    runs = (await get("/runs" + query({ status: status.value, limit: LIMIT }))).runs;
    if (changed([status.value, runs])) show();
  };
  status.addEventListener("change", refresh);
  text.addEventListener("input", show);

  replace(
    main,
    h("h1", {}, "Runs"),
    h("form", { class: "filters", role: "search", "aria-label": "Filter runs", onsubmit: (e) => e.preventDefault() }, field("Status", status), field("Containing", text)),
    count,
    rows,
  );
  return watch(["run"], refresh);
}

function searchable(run) {
  return [run.run_id, run.type, run.status, run.agent_name, run.runner_id, run.session_name, run.session_id, ...(run.command || []), run.prompt]
    .filter(Boolean)
    .join(" ")
    .toLowerCase();
}

export function what(run) {
  if (run.type === "command") return h("code", {}, firstLine(run.command.join(" "), 80));
  const who = run.agent_name || run.type;
  return `${who}: ${firstLine(run.prompt || "", 60)}`;
}

function row(run) {
  return h(
    "tr",
    { "data-run-id": run.run_id, "data-status": run.status },
    h("td", {}, runLink(run.run_id)),
    h("td", {}, badge(run.status)),
    h("td", {}, what(run)),
    h("td", {}, run.runner_id || "—"),
    h("td", { class: "num" }, `${run.attempts}/${run.max_attempts}`),
    h("td", { class: "num" }, money(run.cost_usd)),
    h("td", {}, when(run.created_at)),
    h("td", { class: "num" }, duration(runDuration(run))),
  );
}
