// One run: what it is, its attempts and cost, its output following live; cancel, retry.

import { get, post } from "../api.js";
import { actionButton, badge, changes, duration, facts, h, money, replace, runDuration, TERMINAL, toast, when } from "../dom.js";
import { followLogs, watch } from "../live.js";

export function render(main, { id }) {
  const heading = h("h1", {}, "Run ", h("code", {}, id));
  const status = h("p", { class: "run-status", role: "status" });
  const actions = h("div", { class: "actions" });
  const about = h("dl", { class: "facts" });
  const output = h("pre", { class: "log", role: "log", "aria-label": `Output of ${id}`, tabindex: "0", id: "run-log" });
  const ended = h("p", { class: "muted", id: "log-state" }, "following…");
  let lastAttempt = null;
  const changed = changes();

  const draw = (run) => {
    if (!changed(run)) return;
    replace(
      status,
      badge(run.status),
      run.cancel_requested && !TERMINAL.has(run.status) ? " cancel requested" : "",
      // Its last attempt's runner is gone: the run waits for that runner's late report.
      run.status === "lost"
        ? ` waiting${run.lost_until ? ` until ${new Date(run.lost_until).toLocaleTimeString()}` : ""} for its runner to report the attempt, else it fails`
        : "",
    );
    status.dataset.status = run.status;
    replace(
      actions,
      actionButton("Cancel", `Cancel run ${id}`, async () => draw(await post(`/runs/${id}/cancel`)), {
        danger: true,
        disabled: TERMINAL.has(run.status) || run.cancel_requested,
      }),
      actionButton("Retry", `Retry run ${id} as a new run`, async () => {
        const created = await post(`/runs/${id}/retry`);
        toast(`Retried as ${created.run_id}`);
        window.location.hash = `#/runs/${created.run_id}`;
      }, { disabled: !TERMINAL.has(run.status) || run.type === "task" }),
    );
    replace(about, facts(factsOf(run)));
  };
  const refresh = async () => draw(await get(`/runs/${id}`));

  replace(main, heading, status, actions, about, h("h2", {}, "Output"), output, ended);
  const stopLogs = followLogs(id, {
    onLine(line) {
      if (line.attempt !== lastAttempt) {
        if (lastAttempt !== null || line.attempt > 1) output.append(h("span", { class: "attempt" }, `── attempt ${line.attempt} ──\n`));
        lastAttempt = line.attempt;
      }
      const atBottom = output.scrollTop + output.clientHeight >= output.scrollHeight - 4;
      output.append(h("span", { class: line.stream === "stderr" ? "stderr" : "" }, line.text + "\n"));
      if (atBottom) output.scrollTop = output.scrollHeight;
    },
    onEnd(run) {
      ended.textContent = `ended: ${run.status}`;
      draw(run);
    },
  });
  const stopWatching = watch(["run"], refresh, (event) => event.payload?.run_id === id);
  return () => {
    stopLogs();
    stopWatching();
  };
}

function factsOf(run) {
  const found = [
    ["Type", run.type],
    ["What", run.type === "command" ? h("code", {}, run.command.join(" ")) : run.prompt || "—", "wide"],
    ["Agent", run.agent_name || "—"],
    ["Session", run.session_id ? h("a", { href: `#/sessions/${encodeURIComponent(run.session_id)}` }, run.session_name || run.session_id) : run.session_name || "—"],
    ["Runner", run.runner_id || "—"],
    ["Attempts", `${run.attempts} of at most ${run.max_attempts}${run.rate_limited ? ` (${run.rate_limited} given back after rate limits)` : ""}`],
    ["Exit code", run.exit_code ?? "—"],
    ["Cost", money(run.cost_usd)],
    ["Turns", run.num_turns ?? "—"],
    ["Created", when(run.created_at)],
    ["Started", when(run.started_at)],
    ["Finished", when(run.finished_at)],
    ["Took", duration(runDuration(run))],
    ["Labels", run.labels.length ? run.labels.join(", ") : "—"],
  ];
  if (run.error) found.push(["Error", h("span", { class: "error" }, run.error), "wide"]);
  if (run.result) found.push(["Result", h("pre", { class: "result" }, run.result), "wide"]);
  if (run.task_id) found.push(["Task", run.task_id]);
  return found;
}
