// kvgate status page: reads the admin JSON API with the session cookie. Every value from the
// gateway (and so from engines and tenants) is written with textContent, never as HTML.
"use strict";

const api = "../"; // the page is /admin/ui/; the admin API is /admin/
let csrf = "";
let timer = null;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function num(v) {
  return typeof v === "number" ? v.toLocaleString("en-US") : "—";
}

async function call(path, method) {
  const opts = { method: method || "GET", credentials: "same-origin", headers: {} };
  if (opts.method !== "GET") opts.headers["X-Kvgate-Csrf"] = csrf;
  const r = await fetch(api + path, opts);
  const body = await r.json().catch(() => ({}));
  if (r.status === 401) {
    showLogin(false);
    throw new Error("signed out");
  }
  if (!r.ok) throw new Error(path + ": " + ((body.error && body.error.message) || r.status));
  return body;
}

function showLogin(failed) {
  clearInterval(timer);
  document.getElementById("status").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").hidden = !failed;
}

function fill(section, rows, build) {
  const body = document.querySelector("#" + section + " tbody");
  body.replaceChildren(...rows.map(build));
  const empty = document.querySelector("#" + section + " .empty");
  if (empty) empty.hidden = rows.length > 0;
}

function cell(tr, field, text, cls) {
  const td = el("td", text, cls);
  td.dataset.field = field;
  tr.appendChild(td);
  return td;
}

function backendRow(b) {
  const tr = el("tr");
  tr.dataset.backend = b.name;
  const c = b.capacity || null;
  cell(tr, "name", b.name);
  cell(tr, "role", b.configured_role + (b.role_matches ? "" : " (engine says " + (b.reported_disaggregation_mode || "?") + ")"),
    b.role_matches ? "" : "bad");
  let health = b.usable ? "usable" : "not usable";
  if (b.quarantined_until) health = "quarantined";
  else if (!c) health = "capacity unknown";
  if (b.last_error) health += ": " + b.last_error;
  cell(tr, "health", health, b.usable ? "ok" : "bad");
  cell(tr, "context", c ? num(c.max_model_len) : "unknown", "num");
  cell(tr, "pool", c ? num(c.max_total_num_tokens) : "unknown", "num");
  let mril = c ? num(c.max_req_input_len) : "unknown";
  if (c && c.reported_max_req_input_len) mril += " (engine reported " + num(c.reported_max_req_input_len) + ")";
  cell(tr, "max_req_input_len", mril, "num");
  cell(tr, "alarm", !c ? "unknown" : b.pool_alarm ? "ALARM: pool smaller than context" : "ok", !c ? "warn" : b.pool_alarm ? "bad" : "ok");
  const q = b.quarantined_until;
  cell(tr, "quarantine", q ? "quarantined until " + q.replace("T", " ").replace(/\..*Z$/, "Z") : "—", q ? "bad" : "");
  const act = cell(tr, "action", "");
  if (q) {
    const btn = el("button", "Release");
    btn.type = "button";
    btn.dataset.release = b.name;
    btn.addEventListener("click", () => act_(b.name, "release"));
    act.appendChild(btn);
  } else {
    const btn = el("button", "Quarantine");
    btn.type = "button";
    btn.dataset.quarantine = b.name;
    btn.addEventListener("click", () => {
      if (confirm("Take " + b.name + " out of rotation on every replica?")) act_(b.name, "quarantine");
    });
    act.appendChild(btn);
  }
  return tr;
}

async function act_(name, what) {
  try {
    await call("backends/" + encodeURIComponent(name) + "/" + what, "POST");
  } catch (e) {
    showError(e);
  }
  refresh();
}

function incidentRow(i) {
  const tr = el("tr");
  tr.dataset.incident = i.request_id;
  cell(tr, "time", (i.time || "").replace("T", " ").replace(/\..*Z$/, "Z"));
  cell(tr, "kind", i.kind, i.kind === "leak" || i.kind === "count_drift" ? "bad" : "warn");
  cell(tr, "victim", i.victim);
  cell(tr, "requester", i.requester);
  cell(tr, "backends", (i.backends || []).join(", "));
  cell(tr, "request_id", i.request_id);
  if (i.kind === "count_drift") {
    // No prompt text: the model, route and both counts.
    cell(tr, "context", "model " + i.model + ", " + i.route + " (" + i.tier + "): engine counted " + num(i.engine_tokens) +
      " prompt tokens, admission's bound was " + num(i.admitted_tokens), "context");
  } else {
    cell(tr, "context", i.context, "context");
  }
  return tr;
}

function failClosedRow(m) {
  const tr = el("tr");
  tr.dataset.failclosed = m.model;
  cell(tr, "model", m.model);
  cell(tr, "since", (m.since || "").replace("T", " ").replace(/\..*Z$/, "Z"));
  const act = cell(tr, "action", "");
  const btn = el("button", "Clear");
  btn.type = "button";
  btn.dataset.clear = m.model;
  btn.addEventListener("click", async () => {
    try {
      await call("models/" + encodeURIComponent(m.model) + "/clear-fail-closed", "POST");
    } catch (e) {
      showError(e);
    }
    refresh();
  });
  act.appendChild(btn);
  return tr;
}

function sumBy(rows, label) {
  const out = {};
  for (const r of rows || []) {
    const k = r.labels[label];
    out[k] = (out[k] || 0) + r.value;
  }
  return out;
}

function tenantRow(t, settled, limited) {
  const tr = el("tr");
  tr.dataset.tenant = t.name;
  const lim = (v) => (v > 0 ? num(v) : "no limit");
  cell(tr, "name", t.name);
  cell(tr, "source", t.source);
  cell(tr, "rpm", lim(t.rpm), "num");
  cell(tr, "tpm", lim(t.tpm), "num");
  cell(tr, "max_concurrent", lim(t.max_concurrent), "num");
  cell(tr, "max_prompt_tokens", lim(t.max_prompt_tokens), "num");
  cell(tr, "tokens_used", num(settled[t.name] || 0), "num");
  cell(tr, "refused_429", num(limited[t.name] || 0), (limited[t.name] || 0) > 0 ? "num warn" : "num");
  return tr;
}

function refusalRows(counters) {
  const rows = [];
  for (const r of counters.refusals || []) {
    rows.push({ decision: r.labels.decision, reason: r.labels.reason, value: r.value });
  }
  const byLimit = sumBy(counters.rate_limited, "limit");
  for (const k of Object.keys(byLimit)) rows.push({ decision: "rate_limited (429)", reason: k, value: byLimit[k] });
  // One row per decision and reason (the counting tier is summed away).
  const merged = {};
  for (const r of rows) {
    const k = r.decision + "\u0000" + r.reason;
    merged[k] = merged[k] ? { ...r, value: merged[k].value + r.value } : r;
  }
  return Object.values(merged).sort((a, b) => b.value - a.value);
}

function refusalRow(r) {
  const tr = el("tr");
  tr.dataset.reason = r.reason;
  cell(tr, "decision", r.decision);
  cell(tr, "reason", r.reason);
  cell(tr, "count", num(r.value), "num");
  return tr;
}

function showError(e) {
  const p = document.getElementById("error");
  p.textContent = String(e.message || e);
  p.hidden = false;
}

// Each section loads on its own: with Redis down the incident list fails (503) while the
// backends, which this replica reads itself, still show.
async function refresh() {
  const [b, inc, ten, st, fc] = await Promise.allSettled([call("backends"), call("incidents?limit=50"), call("tenants"), call("stats"),
    call("models/fail-closed")]);
  const errors = [];
  const ok = (r) => {
    if (r.status === "fulfilled") return r.value;
    if (r.reason.message !== "signed out") errors.push(r.reason.message);
    return null;
  };
  const backends = ok(b), incidents = ok(inc), tenants = ok(ten), stats = ok(st), failClosed = ok(fc);
  if (backends) fill("backends", backends.backends || [], backendRow);
  if (failClosed) fill("failclosed", failClosed.fail_closed || [], failClosedRow);
  if (incidents) fill("incidents", incidents.incidents || [], incidentRow);
  const counters = stats ? stats.counters : {};
  if (tenants) {
    const settled = sumBy(counters.tokens_settled, "tenant");
    const limited = sumBy(counters.rate_limited, "tenant");
    fill("tenants", tenants.tenants || [], (t) => tenantRow(t, settled, limited));
  }
  if (stats) fill("refusals", refusalRows(counters), refusalRow);
  const p = document.getElementById("error");
  p.textContent = errors.join("; ");
  p.hidden = errors.length === 0;
  document.getElementById("updated").textContent = "updated " + new Date().toISOString().replace("T", " ").replace(/\..*Z$/, "Z");
  document.body.dataset.loaded = "1";
}

async function start() {
  const r = await fetch("session", { credentials: "same-origin" });
  if (r.status !== 200) {
    showLogin(new URLSearchParams(location.search).get("login") === "failed");
    return;
  }
  csrf = (await r.json()).csrf_token;
  document.getElementById("login").hidden = true;
  document.getElementById("status").hidden = false;
  document.getElementById("logout").hidden = false;
  await refresh();
  timer = setInterval(refresh, 5000);
}

document.getElementById("logout").addEventListener("click", async () => {
  await fetch("logout", { method: "POST", credentials: "same-origin", headers: { "X-Kvgate-Csrf": csrf } });
  location.replace("./");
});

start();
