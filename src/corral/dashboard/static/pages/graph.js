// A plan's tasks drawn as their dependency graph: a column per depth (a task stands right
// of everything it waits for), each task a box coloured by its state.

import { h } from "../dom.js";

const BOX_W = 168;
const BOX_H = 48;
const GAP_X = 56;
const GAP_Y = 16;

export function graph(tasks, onPick) {
  const byKey = new Map(tasks.map((t) => [t.id, t]));
  const depth = new Map();
  const depthOf = (key) => {
    if (!depth.has(key)) {
      depth.set(key, 0); // a cycle cannot be imported; this only guards the recursion
      const blockers = (byKey.get(key)?.after || []).filter((k) => byKey.has(k));
      depth.set(key, blockers.length ? 1 + Math.max(...blockers.map(depthOf)) : 0);
    }
    return depth.get(key);
  };
  const columns = [];
  for (const task of tasks) (columns[depthOf(task.id)] ||= []).push(task);
  const place = new Map();
  columns.forEach((column, x) => column.forEach((task, y) => place.set(task.id, { x: x * (BOX_W + GAP_X), y: y * (BOX_H + GAP_Y) })));
  const width = Math.max(1, columns.length) * (BOX_W + GAP_X) - GAP_X;
  const height = Math.max(1, ...columns.map((c) => c.length)) * (BOX_H + GAP_Y) - GAP_Y;

  const edges = tasks.flatMap((task) =>
    (task.after || [])
      .filter((k) => place.has(k))
      .map((k) => {
        const from = place.get(k);
        const to = place.get(task.id);
        const [x1, y1, x2, y2] = [from.x + BOX_W, from.y + BOX_H / 2, to.x, to.y + BOX_H / 2];
        const bend = (x2 - x1) / 2;
        return h("path", { class: "edge", d: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2 - 4},${y2}` });
      }),
  );
  const nodes = tasks.map((task) => {
    const { x, y } = place.get(task.id);
    return h(
      "g",
      { class: `node t-${task.status}`, "data-task": task.id, "data-status": task.status, transform: `translate(${x},${y})`, onclick: () => onPick(task.id) },
      h("title", {}, `${task.id}: ${task.status.replaceAll("_", " ")} — ${task.title}`),
      h("rect", { width: BOX_W, height: BOX_H, rx: 6 }),
      h("text", { x: 10, y: 20, class: "key" }, clip(task.id, 20)),
      h("text", { x: 10, y: 38, class: "state" }, task.status.replaceAll("_", " ")),
    );
  });
  const counts = {};
  for (const task of tasks) counts[task.status] = (counts[task.status] || 0) + 1;
  const said = Object.entries(counts).map(([s, n]) => `${n} ${s.replaceAll("_", " ")}`).join(", ");
  return h(
    "svg",
    { class: "graph", viewBox: `-8 -8 ${width + 16} ${height + 16}`, width: width + 16, height: height + 16, role: "img", "aria-label": `Graph of ${tasks.length} tasks: ${said}` },
    h("g", {}, edges),
    h("g", {}, nodes),
  );
}

function clip(text, max) {
  return text.length > max ? text.slice(0, max - 1) + "…" : text;
}
