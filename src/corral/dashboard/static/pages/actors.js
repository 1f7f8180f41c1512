// Actors: each with its pool, state and runner; wake, sleep, destroy. Below, the pools: how
// many of each pool's actors are in each state, and for a serverless pool its endpoint,
// the slots its actors want, the runners its autoscaler wants and has, its last error.
// Both update from the event stream's actor and pool events.

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
    const [{ actors }, { pools: known }] = await Promise.all([get("/actors" + query({ state: wanted, limit: 200 })), get("/pools")]);
    if (!changed([state.value, actors, known])) return;
    replace(rows, table("Actors", ["Actor", "Key", "Pool", "State", "Runner", "Generation", "Created", "Actions"], actors.map((actor) => row(actor, refresh))));
    replace(pools, table("Pools", ["Pool", "Actors", "Endpoint", "Wanted slots", "Runners (live / desired)", "Last error"], byPool(actors, known)));
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
  return watch(["actor", "pool"], refresh);
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

// Every pool that has settings of its own (GET /pools) or actors listed here.
function byPool(actors, known) {
  const counts = new Map(known.map((pool) => [pool.name, {}]));
  for (const actor of actors) {
    const found = counts.get(actor.pool) || {};
    found[actor.state] = (found[actor.state] || 0) + 1;
    counts.set(actor.pool, found);
  }
  const settings = new Map(known.map((pool) => [pool.name, pool]));
  return [...counts.keys()].sort().map((name) => {
    const pool = settings.get(name);
    const serverless = pool && pool.serverless;
    const live = pool ? pool.runners.filter((r) => !r.closing).length : 0;
    const error = pool && pool.errors.length ? pool.errors[0] : null;
    return h(
      "tr",
      { "data-pool": name, "data-desired": serverless ? pool.desired_runners : "" },
      h("td", {}, name),
      h("td", {}, Object.entries(counts.get(name)).map(([s, n]) => `${n} ${s}`).join(", ") || "none"),
      h("td", {}, serverless ? h("code", {}, serverless.url) : "—"),
      h("td", { class: "num" }, serverless ? pool.wanted_slots : "—"),
      h("td", { class: "num" }, serverless ? `${live} / ${pool.desired_runners}` : "—"),
      h("td", {}, error ? [h("span", { class: "badge s-failed" }, error.kind), " ", error.message, " ", when(error.at)] : "—"),
    );
  });
}
