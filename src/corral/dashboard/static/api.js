// The coordinator's REST API, with the operator's token.
//
// The token comes in the page's fragment (`/#token=…`, as `corral up` prints it: a fragment
// never reaches a server or its logs), or from the sign-in form; it is kept in this tab's
// sessionStorage only, and the fragment is wiped from the address bar at once.

const KEY = "corral.token";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// `#token=…&page=/plans/ID`: keep the token, show the page, wipe both from the address bar.
export function takeTokenFromFragment() {
  if (!window.location.hash.startsWith("#token=")) return;
  const given = new URLSearchParams(window.location.hash.slice(1));
  sessionStorage.setItem(KEY, given.get("token"));
  const page = (given.get("page") || "/runs").replace(/^\/*/, "/");
  history.replaceState(null, "", window.location.pathname + window.location.search + "#" + page);
}

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (value) => sessionStorage.setItem(KEY, value.trim()),
  clear: () => sessionStorage.removeItem(KEY),
};

let onUnauthorized = () => {};
export function whenUnauthorized(handler) {
  onUnauthorized = handler;
}

export function headers(extra = {}) {
  return { Authorization: `Bearer ${token.get()}`, ...extra };
}

// A JSON call; an error answer becomes an ApiError with the API's stable code.
export async function call(method, path, body, { signal } = {}) {
  const init = { method, headers: headers(), signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) {
    const error = (data && data.error) || {};
    if (response.status === 401) onUnauthorized(error.message);
    throw new ApiError(response.status, error.code || "http_error", error.message || response.statusText);
  }
  return data;
}

export const get = (path, options) => call("GET", path, undefined, options);
export const post = (path, body) => call("POST", path, body === undefined ? {} : body);

export function query(params) {
  const found = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "");
  return found.length ? "?" + new URLSearchParams(found).toString() : "";
}
