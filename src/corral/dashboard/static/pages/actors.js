// Actors: each with its pool, state and runner; wake, sleep, destroy. Below, their pools:
// how many of each pool's actors are in each state.

import { actionButton, changes, field, h, replace, table, when } from "../dom.js";
import { call, get, post, query } from "../api.js";
import { watch } from "../live.js";

const STATES = ["pending", "starting", "running", "sleeping", "stopping", "stopped", "destroyed"];
const ASLEEP = new Set(["sleeping", "stopped", "pending"]);

export function render(main) {
  const state = h("select", { id: "actors-state", name: "state" }, h("option", { value: "" }, "any but destroyed"), STATES.map((s) => h("option", { value: s }, s)));
  const rows = h("div");
  const pools = h("div");
  const changed = changes();
  const refresh = async () => {
    const wanted = state.value || STATES.filter((s) => s !== "destroyed").join(",");
    const { actors } = await get("/actors" + query({ state: wanted, limit: 200 }));
    if (!changed([state.value, actors])) return;
    replace(rows, table("Actors", ["Actor", "Key", "Pool", "State", "Runner", "Generation", "Created", "Actions"], actors.map((actor) => row(actor, refresh))));
    replace(pools, table("Pools", ["Pool", "Actors"], byPool(actors)));
  };
  state.addEventListener("change", refresh);
  replace(
    main,
    h("h1", {}, "Actors"),
    h("form", { class: "filters", role: "search", "aria-label": "Filter actors", onsubmit: (e) => e.preventDefault() }, field("State", state)),
    rows,
    h("h2", {}, "Pools"),
    pools,
  );
  return watch(["actor", "pool", "runner"], refresh);
}

function row(actor, refresh) {
  const base = `/actors/${encodeURIComponent(actor.actor_id)}`;
  const label = `${actor.name}${actor.key ? ` ${actor.key}` : ""}`;
  const gone = actor.state === "destroyed";
  const act = (doing) => async () => {
    await doing();
    await refresh();
  };
  return h(
    "tr",
    { "data-actor-id": actor.actor_id, "data-state": actor.state },
    h("td", {}, h("strong", {}, actor.name), h("br"), h("small", { class: "muted" }, actor.actor_id)),
    h("td", {}, actor.key === null ? "—" : h("code", {}, actor.key)),
    h("td", {}, actor.pool),
    h("td", {}, h("span", { class: `badge a-${actor.state}` }, actor.state), actor.connectable ? " connectable" : ""),
    h("td", {}, actor.runner_id || "—"),
    h("td", { class: "num" }, actor.generation),
    h("td", {}, when(actor.created_at)),
    h(
      "td",
      { class: "actions" },
      actionButton("Wake", `Wake actor ${label}`, act(() => post(`${base}/wake`)), { disabled: gone || !ASLEEP.has(actor.state) }),
      actionButton("Sleep", `Put actor ${label} to sleep`, act(() => post(`${base}/sleep`)), { disabled: gone || actor.state === "sleeping" }),
      actionButton("Destroy", `Destroy actor ${label}`, act(() => call("DELETE", base)), { danger: true, disabled: gone }),
    ),
  );
}

function byPool(actors) {
  const found = new Map();
  for (const actor of actors) {
    const counts = found.get(actor.pool) || {};
    counts[actor.state] = (counts[actor.state] || 0) + 1;
    found.set(actor.pool, counts);
  }
  return [...found].map(([pool, counts]) =>
    h("tr", { "data-pool": pool }, h("td", {}, pool), h("td", {}, Object.entries(counts).map(([s, n]) => `${n} ${s}`).join(", "))),
  );
}
