// Runners: transport, slots in use, last ping, state; drain or stop one.

import { actionButton, ago, changes, h, replace, table } from "../dom.js";
import { get, post } from "../api.js";
import { watch } from "../live.js";

const GONE = new Set(["stopped", "lost"]);

export function render(main) {
  const rows = h("div");
  const changed = changes();
  const refresh = async () => {
    const { runners } = await get("/runners");
    if (!changed(runners)) return;
    replace(
      rows,
      table("Runners", ["Runner", "State", "Transport", "Slots", "Labels", "Last ping", "Version", "Actions"], runners.map((runner) => row(runner, refresh))),
    );
  };
  replace(main, h("h1", {}, "Runners"), rows);
  return watch(["runner"], refresh);
}

function row(runner, refresh) {
  const name = runner.name;
  const act = (verb) => async () => {
    await post(`/runners/${encodeURIComponent(runner.runner_id)}/${verb}`);
    await refresh();
  };
  return h(
    "tr",
    { "data-runner-id": runner.runner_id, "data-state": runner.state },
    h("td", {}, h("strong", {}, name), h("br"), h("small", { class: "muted" }, runner.runner_id)),
    h("td", {}, h("span", { class: `badge r-${runner.state}` }, runner.state)),
    h("td", {}, runner.transport),
    h(
      "td",
      {},
      h("meter", { min: "0", max: String(runner.slots_total), value: String(runner.slots_used), "aria-label": `slots of ${name} in use` }),
      ` ${runner.slots_used}/${runner.slots_total}`,
    ),
    h("td", {}, runner.labels.join(", ") || "—"),
    h("td", {}, ago(runner.last_heartbeat_at)),
    h("td", {}, runner.version || "—"),
    h(
      "td",
      { class: "actions" },
      actionButton("Drain", `Drain runner ${name}`, act("drain"), { disabled: GONE.has(runner.state) || runner.state === "draining" }),
      actionButton("Stop", `Stop runner ${name}`, act("stop"), { danger: true, disabled: GONE.has(runner.state) }),
    ),
  );
}
