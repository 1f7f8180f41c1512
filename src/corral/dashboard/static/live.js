// Live updates, owned here alone: pages say which kinds of change they show and how to
// read them again (`watch`); this module decides when.
//
// With the coordinator's event stream (`GET /events`, server-sent events with ids), each
// event of a watched kind re-reads the pages that show it; after a reconnect the stream
// resumes from the last id it gave (`Last-Event-ID`), and every page is read again over
// REST, which covers whatever happened while it was away. A resume the coordinator can no
// longer serve (an id it never had, or events its retention deleted) starts afresh: the
// REST re-read covers that too. A coordinator without the stream is polled instead. A
// run's log lines have their own stream (`followLogs`), so the event stream leaves them out.

import { ApiError, headers, query } from "./api.js";

const POLL_MS = 1000;
const MIN_GAP_MS = 250;
const BACKOFF_MS = [250, 500, 1000, 2000, 5000];
// The kinds the stream carries (not "log": see above). A page that shows another kind is
// polled for it, stream or not.
const STREAMED = ["run", "session", "task", "plan", "runner", "actor", "pool"];
const CONTROL_EVENTS = new Set(["ready", "caught_up", "dropped"]);
const watchers = new Set();
let stateListener = () => {};
let lastEventId = null;

// `kinds`: event kinds ("run", "runner", "task", "session", …; "run" also matches
// "run.status" and the like); `about(event)`, if given, narrows them (one run's events).
// `refresh`: reads the page's data again; never run twice at once, and changes that come
// while it runs make one more read.
export function watch(kinds, refresh, about = () => true) {
  const watcher = { kinds, about, refresh: single(refresh) };
  watchers.add(watcher);
  watcher.refresh();
  return () => watchers.delete(watcher);
}

export function onState(listener) {
  stateListener = listener;
}

function single(refresh) {
  let running = null;
  let again = false;
  const go = async () => {
    if (running) {
      again = true;
      return running;
    }
    running = (async () => {
      for (;;) {
        again = false;
        try {
          await refresh();
        } catch (error) {
          if (!(error instanceof ApiError && error.status === 401)) console.warn("refresh failed:", error);
        }
        if (!again) break;
        // Changes keep coming (a busy coordinator): read again, but not more often than this.
        await new Promise((resolve) => setTimeout(resolve, MIN_GAP_MS));
      }
      running = null;
    })();
    return running;
  };
  return go;
}

// Every page, or (given an event) the pages that show its kind and care about it.
function refreshAll(event) {
  for (const watcher of watchers) {
    if (event === undefined || (watcher.kinds.some((k) => event.kind === k || event.kind.startsWith(k + ".")) && watcher.about(event))) {
      watcher.refresh();
    }
  }
}

export async function start() {
  if (await hasEventStream()) {
    stream(0);
    poll((watcher) => watcher.kinds.some((kind) => !STREAMED.includes(kind)));
  } else {
    stateListener("live (polling every second)");
    poll(() => true);
  }
}

async function hasEventStream() {
  try {
    const schema = await (await fetch("/openapi.json")).json();
    return Boolean(schema.paths && schema.paths["/events"]);
  } catch {
    return false;
  }
}

function poll(which) {
  setInterval(() => {
    if (document.visibilityState !== "visible") return;
    for (const watcher of watchers) if (which(watcher)) watcher.refresh();
  }, POLL_MS);
}

async function stream(failures) {
  stateListener(failures ? "reconnecting…" : "connecting…");
  try {
    const response = await fetch("/events" + query({ kind: STREAMED.join(",") }), {
      headers: headers({ Accept: "text/event-stream", ...(lastEventId ? { "Last-Event-ID": lastEventId } : {}) }),
    });
    if (response.status === 410 || response.status === 422) {
      lastEventId = null; // that position is gone: start at the newest, after a re-read
      throw new Error(`GET /events refused the resume (${response.status})`);
    }
    if (!response.ok) throw new Error(`GET /events answered ${response.status}`);
    stateListener("live");
    failures = 0;
    refreshAll(); // what changed while there was no stream
    for await (const event of serverSentEvents(response.body)) {
      if (event.id) lastEventId = event.id;
      if (!CONTROL_EVENTS.has(event.kind)) refreshAll(event);
    }
  } catch (error) {
    console.warn("event stream:", error.message);
  }
  const wait = BACKOFF_MS[Math.min(failures, BACKOFF_MS.length - 1)];
  setTimeout(() => stream(failures + 1), wait);
}

// The events of a `text/event-stream` body (the fields EventSource reads: id, event, data).
async function* serverSentEvents(body) {
  let event = { data: [] };
  for await (const line of lines(body)) {
    if (line === "") {
      if (event.data.length || event.event) yield eventOf(event);
      event = { data: [] };
    } else if (!line.startsWith(":")) {
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "data") event.data.push(value);
      else if (field === "id" || field === "event") event[field] = value;
    }
  }
}

function eventOf({ id, event, data }) {
  let payload = null;
  try {
    payload = JSON.parse(data.join("\n"));
  } catch {
    payload = null;
  }
  return { id, kind: event || (payload && payload.kind) || "message", payload };
}

async function* lines(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    const parts = buffer.split(/\r\n|\r|\n/);
    buffer = parts.pop();
    yield* parts;
  }
}

// A run's output as it is written: `onLine(line)` for each, then `onEnd(run)`. Follows
// across dropped connections from the last line it had; `stop()` ends it.
export function followLogs(runId, { onLine, onEnd }) {
  const abort = new AbortController();
  let after = 0;
  let failures = 0;
  (async () => {
    while (!abort.signal.aborted) {
      try {
        const response = await fetch(`/runs/${encodeURIComponent(runId)}/logs` + query({ follow: "true", after }), {
          headers: headers(),
          signal: abort.signal,
        });
        if (!response.ok) throw new Error(`logs answered ${response.status}`);
        for await (const text of lines(response.body)) {
          if (!text) continue;
          const item = JSON.parse(text);
          if (item.event === "end") {
            onEnd(item.run);
            return;
          }
          after = item.id;
          failures = 0;
          onLine(item);
        }
      } catch (error) {
        if (abort.signal.aborted) return;
        console.warn("log stream:", error.message);
      }
      failures += 1;
      await new Promise((resolve) => setTimeout(resolve, BACKOFF_MS[Math.min(failures, BACKOFF_MS.length - 1)]));
    }
  })();
  return () => abort.abort();
}
