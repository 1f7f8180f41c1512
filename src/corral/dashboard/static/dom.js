// Building the page from data: elements with text (never HTML parsed from data), and the
// way corral writes money, times and durations.

export function h(tag, attrs = {}, ...children) {
  const svg = SVG_TAGS.has(tag);
  const element = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else if (name === "class") element.setAttribute("class", value);
    else if (name in element && !svg && typeof value !== "string") element[name] = value;
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  append(element, children);
  return element;
}

const SVG_TAGS = new Set(["svg", "g", "rect", "line", "path", "text", "title", "circle", "polyline"]);

function append(element, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(element, ...children) {
  element.replaceChildren();
  append(element, children);
}

export const TERMINAL = new Set(["completed", "failed", "cancelled", "timed_out"]);

export function badge(status) {
  return h("span", { class: `badge s-${status}` }, status.replace("_", " "));
}

export function money(usd) {
  if (usd === null || usd === undefined) return "—";
  return "$" + (usd < 1 ? usd.toFixed(4) : usd.toFixed(2));
}

export function when(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  const text = date.toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
  return h("time", { datetime: iso, title: iso }, text);
}

export function ago(iso, now = Date.now()) {
  if (!iso) return "never";
  const seconds = Math.max(0, Math.round((now - new Date(iso).getTime()) / 1000));
  return h("time", { datetime: iso, title: iso }, seconds < 90 ? `${seconds}s ago` : `${duration(seconds)} ago`);
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 1 : 0)}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ${Math.round(seconds % 60)}s`;
  return `${Math.floor(seconds / 3600)}h ${Math.round((seconds % 3600) / 60)}m`;
}

export function runDuration(run) {
  if (!run.started_at) return null;
  const end = run.finished_at ? new Date(run.finished_at) : new Date();
  return (end - new Date(run.started_at)) / 1000;
}

export function firstLine(text, max = 120) {
  if (!text) return "";
  const line = text.split("\n", 1)[0];
  return line.length > max ? line.slice(0, max - 1) + "…" : line;
}

export function runLink(runId) {
  return h("a", { href: `#/runs/${encodeURIComponent(runId)}` }, runId);
}

// A table in a region that scrolls sideways on a narrow screen (and by keyboard).
export function table(label, columns, rows) {
  return h(
    "div",
    { class: "table-wrap", role: "region", "aria-label": label, tabindex: "0" },
    h(
      "table",
      {},
      h("caption", { class: "visually-hidden" }, label),
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows),
    ),
  );
}

// A list of facts, `[term, value]` pairs (a value on a line of its own: `[term, value, "wide"]`).
export function facts(pairs) {
  return pairs.map(([term, value, wide]) => h("div", { class: wide ? "wide" : "" }, h("dt", {}, term), h("dd", {}, value)));
}

export function field(label, control, hint) {
  const id = control.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  control.id = id;
  return h("div", { class: "field" }, h("label", { for: id }, label), control, hint ? h("small", {}, hint) : null);
}

// A button that calls `action` once at a time, and says what went wrong if it fails.
export function actionButton(text, label, action, { danger = false, disabled = false } = {}) {
  const button = h("button", { type: "button", class: danger ? "danger" : "", "aria-label": label, disabled }, text);
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      await action();
    } catch (error) {
      toast(error.message, "error");
    } finally {
      button.disabled = disabled;
    }
  });
  return button;
}

export function toast(message, kind = "info") {
  const box = document.getElementById("toasts");
  const item = h("p", { class: `toast ${kind}` }, message);
  box.append(item);
  setTimeout(() => item.remove(), 6000);
}

// `const changed = changes()`, then `if (!changed(data)) return;`: a page redraws only when
// what it shows changed (a redraw would take the keyboard's focus off a button in it).
export function changes() {
  let last = null;
  return (data) => {
    const now = JSON.stringify(data);
    if (now === last) return false;
    last = now;
    return true;
  };
}
