// The dashboard's shell: sign-in, navigation, and which page shows for which address.

import { get, takeTokenFromFragment, token, whenUnauthorized } from "./api.js";
import { h, replace } from "./dom.js";
import * as live from "./live.js";
import * as actors from "./pages/actors.js";
import * as charts from "./pages/charts.js";
import * as plans from "./pages/plans.js";
import * as run from "./pages/run.js";
import * as runners from "./pages/runners.js";
import * as runs from "./pages/runs.js";
import * as sessions from "./pages/sessions.js";

// Each page: a pattern of the address after `#`, its title, and a module whose
// `render(main, params)` draws it and returns what to do when it is left. A new kind of
// thing is one module and one line here.
const PAGES = [
  { path: /^\/runs$/, nav: "Runs", href: "/runs", module: runs },
  { path: /^\/runs\/(?<id>[^/]+)$/, module: run },
  { path: /^\/sessions$/, nav: "Sessions", href: "/sessions", module: sessions, view: "list" },
  { path: /^\/sessions\/(?<id>[^/]+)$/, module: sessions, view: "one" },
  { path: /^\/plans$/, nav: "Plans", href: "/plans", module: plans, view: "list" },
  { path: /^\/plans\/(?<id>[^/]+)$/, module: plans, view: "one" },
  { path: /^\/runners$/, nav: "Runners", href: "/runners", module: runners },
  { path: /^\/actors$/, nav: "Actors", href: "/actors", module: actors },
  { path: /^\/charts$/, nav: "Charts", href: "/charts", module: charts },
];
const HOME = "#/runs";

let leave = () => {};

function route() {
  const main = document.getElementById("view");
  const address = decodeURI(window.location.hash.replace(/^#/, "")) || "/runs";
  const page = PAGES.find((p) => p.path.test(address));
  leave();
  leave = () => {};
  if (!page) {
    replace(main, h("h1", {}, "Not found"), h("p", {}, h("a", { href: HOME }, "Back to the runs")));
    return;
  }
  const params = { ...address.match(page.path).groups, view: page.view };
  leave = page.module.render(main, params) || (() => {});
  for (const link of document.querySelectorAll("#nav a")) {
    const current = address === link.dataset.path || address.startsWith(link.dataset.path + "/");
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function navigation() {
  const list = document.getElementById("nav");
  for (const page of PAGES.filter((p) => p.nav)) {
    list.append(h("li", {}, h("a", { href: `#${page.href}`, "data-path": page.href }, page.nav)));
  }
}

function askForToken(why) {
  const form = document.getElementById("token-form");
  document.getElementById("view").hidden = true;
  form.hidden = false;
  if (why) document.getElementById("token-why").textContent = why;
  document.getElementById("token-input").focus();
}

async function signIn(event) {
  event.preventDefault();
  const input = document.getElementById("token-input");
  token.set(input.value);
  input.value = "";
  try {
    await get("/stats");
  } catch (error) {
    token.clear();
    askForToken(`That token was refused: ${error.message}`);
    return;
  }
  window.location.reload();
}

function main() {
  takeTokenFromFragment();
  navigation();
  document.getElementById("token-form").addEventListener("submit", signIn);
  whenUnauthorized((message) => {
    token.clear();
    askForToken(`The coordinator refused the token: ${message}`);
  });
  if (!token.get()) {
    askForToken();
    return;
  }
  live.onState((text) => {
    document.getElementById("live-state").textContent = text;
  });
  if (!window.location.hash) history.replaceState(null, "", HOME);
  window.addEventListener("hashchange", () => {
    if (window.location.hash.startsWith("#token=")) {
      // An address with a token opened over this page: start again with that token.
      takeTokenFromFragment();
      window.location.reload();
      return;
    }
    route();
    document.getElementById("view").focus();
  });
  route();
  live.start();
}

main();
