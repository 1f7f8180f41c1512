// Charts: runs per minute by outcome, how long runs take, cost per day and per agent.

import { get } from "../api.js";
import { changes, h, money, replace } from "../dom.js";
import { watch } from "../live.js";

const W = 560;
const H = 180;
const PAD = { left: 52, right: 8, top: 8, bottom: 28 };
const READ_EVERY_MS = 10000;

export function render(main) {
  const totals = h("p", { class: "muted", role: "status" });
  const figures = h("div", { class: "charts" });
  const changed = changes();
  const refresh = async () => {
    const [data, stats] = await Promise.all([get("/stats/charts"), get("/stats")]);
    if (!changed([data, stats])) return;
    totals.textContent = `Runs now: ${Object.entries(stats.runs).map(([s, n]) => `${n} ${s.replace("_", " ")}`).join(", ") || "none"}. Charts from ${data.runs_read} runs${data.truncated ? " (the newest only)" : ""}.`;
    replace(
      figures,
      figure(`Runs finished per minute, last ${data.minutes} minutes, by outcome`, stacked(data)),
      figure(`How long runs took, last ${data.days} days`, bars(data.durations.map((b) => [b.le === null ? "longer" : `≤${seconds(b.le)}`, b.count]), String)),
      figure(`Cost per day, last ${data.days} days`, bars(data.cost_per_day.map((d) => [d.day.slice(5), d.cost_usd]), money, axisMoney)),
      figure(`Cost per agent, last ${data.days} days`, bars(data.cost_per_agent.map((a) => [a.agent, a.cost_usd]), money, axisMoney)),
    );
  };
  replace(main, h("h1", {}, "Charts"), totals, figures);
  const { call, stop } = atMostEvery(READ_EVERY_MS, refresh);
  const stopWatching = watch(["run"], call);
  return () => {
    stop();
    stopWatching();
  };
}

// The series cost the coordinator a read of thousands of runs: however many runs change,
// read them at most once every `ms` (the last change still shows, `ms` later at most).
function atMostEvery(ms, refresh) {
  let last = 0;
  let timer = null;
  const call = async () => {
    const wait = last + ms - Date.now();
    if (wait > 0) {
      timer ??= setTimeout(() => {
        timer = null;
        call();
      }, wait);
      return;
    }
    last = Date.now();
    await refresh();
  };
  return { call, stop: () => clearTimeout(timer) };
}

// An axis has room for about six characters: "$0", "$0.042", "$12.50", "$1.2k" (the bars'
// titles and the figure's label keep the exact amounts).
function axisMoney(usd) {
  if (usd === 0) return "$0";
  if (usd < 1) return "$" + usd.toPrecision(2).replace(/0+$/, "");
  if (usd < 1000) return "$" + usd.toFixed(usd < 100 ? 2 : 0);
  return "$" + (usd / 1000).toFixed(1) + "k";
}

function seconds(s) {
  return s < 60 ? `${s}s` : s < 3600 ? `${s / 60}m` : `${s / 3600}h`;
}

function figure(caption, chart) {
  return h("figure", { class: "chart" }, h("figcaption", {}, caption), chart);
}

function frame(label, max, format) {
  const svg = h("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label, preserveAspectRatio: "xMidYMid meet" });
  const y = (v) => PAD.top + (H - PAD.top - PAD.bottom) * (1 - v / (max || 1));
  svg.append(
    h("line", { class: "axis", x1: PAD.left, x2: W - PAD.right, y1: y(0), y2: y(0) }),
    h("text", { class: "tick", x: PAD.left - 4, y: y(0), "text-anchor": "end" }, format(0)),
  );
  if (max) svg.append(h("text", { class: "tick", x: PAD.left - 4, y: y(max) + 4, "text-anchor": "end" }, format(max)));
  return { svg, y };
}

function stacked(data) {
  const series = data.runs_per_minute;
  const max = Math.max(1, ...series.map((m) => data.outcomes.reduce((n, o) => n + m[o], 0)));
  const total = series.reduce((n, m) => n + data.outcomes.reduce((k, o) => k + m[o], 0), 0);
  const { svg, y } = frame(`${total} runs finished in the last ${data.minutes} minutes`, max, String);
  const step = (W - PAD.left - PAD.right) / series.length;
  series.forEach((minute, i) => {
    let base = 0;
    for (const outcome of data.outcomes) {
      const n = minute[outcome];
      if (!n) continue;
      svg.append(
        h("rect", { class: `bar s-${outcome}`, x: PAD.left + i * step + 0.5, width: Math.max(1, step - 1), y: y(base + n), height: y(base) - y(base + n) }, h("title", {}, `${minute.minute.slice(11, 16)} UTC: ${n} ${outcome}`)),
      );
      base += n;
    }
  });
  const last = series.length - 1;
  for (const [i, anchor] of [[0, "start"], [Math.floor(last / 2), "middle"], [last, "end"]]) {
    svg.append(h("text", { class: "tick", x: PAD.left + i * step + step / 2, y: H - 8, "text-anchor": anchor }, series[i].minute.slice(11, 16)));
  }
  const legend = h("ul", { class: "legend" }, data.outcomes.map((o) => h("li", {}, h("span", { class: `swatch s-${o}` }), o.replace("_", " "))));
  return h("div", {}, svg, legend);
}

function bars(pairs, format, axisFormat = format) {
  const max = Math.max(0, ...pairs.map(([, v]) => v));
  const { svg, y } = frame(pairs.map(([k, v]) => `${k}: ${format(v)}`).join("; ") || "no data", max, axisFormat);
  const step = (W - PAD.left - PAD.right) / Math.max(1, pairs.length);
  pairs.forEach(([key, value], i) => {
    const x = PAD.left + i * step;
    svg.append(
      h("rect", { class: "bar", x: x + step * 0.1, width: step * 0.8, y: y(value), height: y(0) - y(value) }, h("title", {}, `${key}: ${format(value)}`)),
      h("text", { class: "tick", x: x + step / 2, y: H - 8, "text-anchor": "middle" }, key.length > 10 ? key.slice(0, 9) + "…" : key),
    );
  });
  return svg;
}
