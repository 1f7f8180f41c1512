// Sessions: each with its runs, latest result and total cost; start one, resume one.

import { get, post, query } from "../api.js";
import { badge, changes, facts, field, firstLine, h, money, replace, runLink, table, toast, when } from "../dom.js";
import { watch } from "../live.js";
import { what } from "./runs.js";

export function render(main, { view, id }) {
  return view === "one" ? one(main, id) : list(main);
}

function list(main) {
  const rows = h("div");
  const changed = changes();
  const refresh = async () => {
    const { sessions } = await get("/sessions" + query({ limit: 200 }));
    if (!changed(sessions)) return;
    replace(
      rows,
      table(
        "Sessions",
        ["Session", "Agent", "Runs", "Cost", "Latest result", "Updated"],
        sessions.map((s) =>
          h(
            "tr",
            { "data-session-id": s.session_id },
            h("td", {}, h("a", { href: `#/sessions/${encodeURIComponent(s.session_id)}` }, s.session_name || s.session_id)),
            h("td", {}, s.agent_name || "—"),
            h("td", { class: "num" }, s.runs),
            h("td", { class: "num" }, money(s.cost_usd)),
            h("td", { class: s.is_error ? "error" : "" }, firstLine(s.result, 80) || "—"),
            h("td", {}, when(s.updated_at)),
          ),
        ),
      ),
    );
  };
  replace(main, h("h1", {}, "Sessions"), startForm(), h("h2", {}, "All sessions"), rows);
  return watch(["session", "run"], refresh);
}

function startForm() {
  const name = h("input", { name: "session_name", required: true, maxlength: "200", autocomplete: "off" });
  const agent = h("select", { name: "agent_name" });
  const dir = h("input", { name: "project_dir", placeholder: "the runner's directory", autocomplete: "off" });
  const prompt = h("textarea", { name: "prompt", required: true, rows: "3" });
  get("/agents").then(({ agents }) => replace(agent, agents.map((a) => h("option", { value: a.name }, `${a.name} (${a.executor})`))));
  return h(
    "details",
    { class: "panel" },
    h("summary", {}, "Start a session"),
    h(
      "form",
      {
        "aria-label": "Start a session",
        async onsubmit(event) {
          event.preventDefault();
          const created = await submit({
            type: "start_session",
            session_name: name.value.trim(),
            agent_name: agent.value || undefined,
            project_dir: dir.value.trim() || undefined,
            prompt: prompt.value,
          });
          if (created) window.location.hash = `#/runs/${created.run_id}`;
        },
      },
      field("Name", name),
      field("Agent", agent),
      field("Directory", dir, "optional"),
      field("Prompt", prompt),
      h("button", { type: "submit" }, "Start"),
    ),
  );
}

async function submit(body) {
  try {
    return await post("/runs", body);
  } catch (error) {
    toast(`${error.code}: ${error.message}`, "error");
    return null;
  }
}

function one(main, id) {
  const about = h("dl", { class: "facts" });
  const result = h("pre", { class: "result", tabindex: "0" });
  const rows = h("div");
  const prompt = h("textarea", { name: "prompt", required: true, rows: "3" });
  const resume = h(
    "form",
    {
      class: "panel",
      "aria-label": "Resume this session",
      async onsubmit(event) {
        event.preventDefault();
        const created = await submit({ type: "resume_session", session_id: id, prompt: prompt.value });
        if (created) window.location.hash = `#/runs/${created.run_id}`;
      },
    },
    field("Prompt", prompt),
    h("button", { type: "submit" }, "Resume"),
  );
  const changed = changes();
  const refresh = async () => {
    const [session, { runs }] = await Promise.all([get(`/sessions/${encodeURIComponent(id)}`), get("/runs" + query({ session: id, limit: 200 }))]);
    if (!changed([session, runs])) return;
    replace(
      about,
      facts([
        ["Name", session.session_name || "—"],
        ["Agent", session.agent_name || "—"],
        ["Runner", session.runner_id || "—"],
        ["Directory", session.project_dir || "—"],
        ["Runs", session.runs],
        ["Total cost", money(session.cost_usd)],
        ["Latest run", session.last_run_id ? runLink(session.last_run_id) : "—"],
        ["Updated", when(session.updated_at)],
      ]),
    );
    result.textContent = session.result || "(no result yet)";
    result.classList.toggle("error", Boolean(session.is_error));
    replace(
      rows,
      table(
        "Runs of this session",
        ["Run", "Status", "What", "Cost", "Created"],
        runs.map((run) => h("tr", { "data-run-id": run.run_id }, h("td", {}, runLink(run.run_id)), h("td", {}, badge(run.status)), h("td", {}, what(run)), h("td", { class: "num" }, money(run.cost_usd)), h("td", {}, when(run.created_at)))),
      ),
    );
  };
  replace(main, h("h1", {}, "Session ", h("code", {}, id)), about, h("h2", {}, "Latest result"), result, h("h2", {}, "Resume it"), resume, h("h2", {}, "Its runs"), rows);
  return watch(["session", "run"], refresh);
}
