// The runner dashboard: plain JS over the HTTP API, no build step, no library. Each view is a
// page of its own under the URL's fragment (#queues, #job/<id>: pages.js routes them), so
// links open it directly and the back and forward buttons move between views.
// Data from jobs (payloads, errors) is only ever set as text, never as HTML.
// The API token lives in sessionStorage (this tab only) and travels as a header, never in a URL.
// What the page shows follows the token's scopes (GET /whoami): no read, no data; no operate,
// no requeue, cancel, delete, pause, run-now or trigger buttons; no enqueue scope for a
// function, no invoke form. A button the token cannot use is never made.
// This file: helpers, sign-in, the queue, schedule, dead-letter and function panels, and the
// wiring. Updates come pushed through the event stream (live.js), not by polling.
"use strict";

const TOKEN_KEY = "runner.token";
const COLORS = ["#2f6feb", "#e8590c", "#087443", "#9c36b5", "#c4320a", "#0b7285"];

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  queues: [],
  deadQueue: null,
  deadCursors: [null],     // the cursor of each page read so far (null: the first)
  deadNext: null,          // the cursor of the page after the one shown
  deadLimit: 25,
  lastFigures: null,       // previous /queues answer, for live latency deltas
  latency: {},             // queue -> [{t, v}] points since the page opened
  throughput: null,
  editing: null,           // the dead job open in the edit dialog
  deadSignature: "",       // what the dead-letter table shows now
  loginOpen: false,
  me: null,                // GET /whoami: the token's name and scopes
};

// --- small helpers --------------------------------------------------------------------

const $ = (sel) => document.querySelector(sel);

// Bidi controls a producer's text may hold (U+202E turns "00.001$" into "$100.00" on
// screen): shown escaped, as `runner logs` shows them, by every text the page paints.
const BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

function plain(text) {
  return String(text).replace(BIDI, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = plain(v);
    else if (k === "title") node.title = plain(v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(plain(c)));
  }
  return node;
}

// replaceChildren, with lists flattened and null, undefined and false left out (as el does).
// The keys a read found of another Redis type ("damaged_keys": another program wrote
// them, or damage): the server's words for each, what it holds and what to do.
function damagedText(damaged) {
  return (Array.isArray(damaged) ? damaged : []).map((d) => `⚠ ${textOf(d && d.detail)}`).join("\n");
}

function damagedNote(data) {
  const text = damagedText(data && data.damaged_keys);
  return text ? el("p", { class: "error", "data-damaged": "", text }) : null;
}

function fill(node, ...children) {
  node.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

// --- JSON, exactly ------------------------------------------------------------------------
// The API takes integers to 2^64 - 1, and a double (JSON.parse's number) holds them exactly
// only to 2^53: 9007199254740993 read into one is 9007199254740992. So every JSON the page
// reads goes through parseJSON, which keeps such an integer as an Exact (its digits as
// sent), and every JSON it shows goes through json or compact, which write an Exact's
// digits back; a payload, an invoke or a signal the page sends is the text in its box,
// sent as it is (Verbatim), never parsed and written again.
class Exact {
  constructor(text) { this.text = text; }
  valueOf() { return Number(this.text); }
  toString() { return this.text; }
}

// A JSON text to send as it is: api() sends it in place of JSON.stringify(body).
class Verbatim {
  constructor(text) { this.text = text; }
}

const LONG_DIGITS = /\d{16}/;  // every integer past 2^53 has 16 digits or more
// A JSON text's strings and numbers, in order (nothing else in it holds a digit).
const JSON_TOKENS = /"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g;

let exactSeen = false;  // until the page reads an Exact, stringify is JSON.stringify alone

// 64 random bits: after a NUL, a mark no text the server sent holds.
function exactMark() {
  const bits = crypto.getRandomValues(new Uint32Array(2));
  return `${bits[0].toString(36)}.${bits[1].toString(36)}:`;
}

// JSON.parse, but an integer a double would round comes back as an Exact.
function parseJSON(text) {
  const value = JSON.parse(text);  // (what is no JSON throws here, as ever)
  if (!LONG_DIGITS.test(text)) return value;
  const mark = exactMark();
  let marked = false;
  // Each such integer becomes a string of the mark and its digits, read back as an Exact.
  const again = text.replace(JSON_TOKENS, (t) => {
    if (t[0] === '"' || /[.eE]/.test(t) || Number.isSafeInteger(Number(t))) return t;
    marked = true;
    return `"\\u0000${mark}${t}"`;
  });
  if (!marked) return value;
  const tag = `\u0000${mark}`;
  exactSeen = true;
  return JSON.parse(again, (k, v) => (typeof v === "string" && v.startsWith(tag) ? new Exact(v.slice(tag.length)) : v));
}
// JSON.stringify, but an Exact is written as its digits.
function stringify(value, indent) {
  if (!exactSeen) return JSON.stringify(value, null, indent);
  const mark = exactMark();
  const held = [];
  const text = JSON.stringify(value, (k, v) => {
    if (!(v instanceof Exact)) return v;
    held.push(v.text);
    return `\u0000${mark}${held.length - 1}`;
  }, indent);
  if (!held.length) return text;
  const at = new RegExp(`"\\\\u0000${mark.replace(".", "\\.")}(\\d+)"`, "g");
  return text.replace(at, (_, i) => held[Number(i)]);
}

// A value as the page shows JSON: indented, or on one line.
function json(value) {
  return stringify(value, 2);
}

function compact(value) {
  return stringify(value);
}

// A list entry's field too big to list comes as a preview (the job's own page has it whole).
function listed(job, field) {
  const size = job.truncated && job.truncated[field];
  if (!size) return json(job[field]);
  return `${job[`${field}_preview`] || ""}… (${size.toLocaleString()} bytes: open the job for all)`;
}

// One time format on every page: UTC, "2026-05-04 13:02:09" (".123" with ms). Every time
// the API gives is epoch seconds; none is shown as a number.
// A time no date can show (another writer's record: 1e300, the year 3,170,843) is "?",
// never an exception that leaves the page unrendered.
function when(seconds, withMs) {
  if (typeof seconds !== "number" || !seconds) return "—";
  if (!(seconds > 0 && seconds < MAX_TIME_S)) return "?";
  const text = new Date(seconds * 1000).toISOString().replace("T", " ");
  return withMs ? text.slice(0, 23) : text.slice(0, 19);
}
const MAX_TIME_S = 253402300800;  // 10000-01-01: the first time past a four-digit year

// A value shown as text: a string as it is, anything else (an object another writer put
// where text belongs) as its JSON, never "[object Object]".
function textOf(value) {
  if (value === undefined || value === null) return "";
  return typeof value === "string" ? value : compact(value);
}

// The time of day alone, in the same format (for "updated ..." and chart axes).
function clock(seconds) {
  return when(seconds === undefined ? Date.now() / 1000 : seconds).slice(11);
}

// A time and how long ago (or ahead) it is: "2026-05-04 13:02:09 (12 s ago)".
function whenAgo(seconds) {
  if (typeof seconds !== "number" || !seconds) return "—";
  const d = Date.now() / 1000 - seconds;
  return `${when(seconds)} (${d >= 0 ? `${age(d)} ago` : `in ${age(-d)}`})`;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 120) return `${seconds.toFixed(1)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function ms(v) {
  return v === null || v === undefined ? "—" : `${v < 10 ? v.toFixed(1) : Math.round(v)} ms`;
}

// A link to a job's page. The id goes into the fragment URI-encoded: it can never make a
// javascript: URL or leave this page.
function jobLink(id, text) {
  return el("a", { href: `#job/${encodeURIComponent(id)}`, class: "job-link", "data-job-link": id, text: text || id });
}

// A done job keeps no attempt budget: its attempt alone then.
function attempts(job) {
  return job.max_attempts ? `${job.attempt} of ${job.max_attempts}` : String(job.attempt);
}

function statusBadge(status) {
  return el("span", { class: `status status-${status}`, "data-field": "status", text: status || "?" });
}

// ctx.progress(percent, message): a bar and its message.
function progressBar(p) {
  const pct = typeof p.percent === "number" ? Math.max(0, Math.min(100, p.percent)) : null;
  return el("span", { class: "progress", "data-field": "progress" },
    pct === null ? null : el("progress", { max: 100, value: pct }),
    pct === null ? null : ` ${Math.round(pct)}%`,
    p.message ? el("span", { class: "muted", text: ` ${textOf(p.message)}` }) : null);
}

function toast(text) {
  const node = el("div", { text });
  $("#toast").append(node);
  setTimeout(() => node.remove(), 4000);
}

// --- the API ----------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = body instanceof Verbatim ? body.text : JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  let data = null;
  if (resp.status !== 204) data = await resp.text().then(parseJSON).catch(() => null);
  if (resp.status === 401) {
    showLogin(state.token ? "That token was refused." : "");
    throw new ApiError(401, data);
  }
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}

// --- sign-in --------------------------------------------------------------------------

function showLogin(message) {
  $("#login-error").textContent = message || "";
  if (!state.loginOpen) {
    state.loginOpen = true;
    $("#login").showModal();
    $("#token").focus();
  }
}

async function signIn(event) {
  event.preventDefault();
  state.token = $("#token").value.trim();
  let me;
  try {
    me = await fetchWithToken();
  } catch (err) {
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, state.token);
  state.loginOpen = false;
  $("#login").close();
  $("#logout").hidden = false;
  applyScopes(me);
  refreshAll();
  liveStart();
}

async function fetchWithToken() {
  const resp = await fetch("/whoami", { headers: { Authorization: `Bearer ${state.token}` }, cache: "no-store" });
  if (!resp.ok) {
    $("#login-error").textContent = resp.status === 401 ? "That token was refused." : `HTTP ${resp.status}`;
    throw new Error("refused");
  }
  return resp.json();
}

function signOut() {
  liveStop();
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = "";
  state.me = null;
  $("#logout").hidden = true;
  $("#whoami").hidden = true;
  showLogin("");
}

// --- scopes -----------------------------------------------------------------------------

// As the server's auth.allows: "enqueue:<type>" is also granted by "enqueue", and a
// signal by "operate".
function can(scope) {
  const scopes = (state.me && state.me.scopes) || [];
  if (scopes.includes(scope)) return true;
  if (scope.startsWith("enqueue:")) return scopes.includes("enqueue");
  if (scope === "signal") return scopes.includes("operate");
  return false;
}

// A button kept across re-renders of a live table (the figures come every second): the
// same node moves into the new row, so a click under way is not lost to a replaced node.
const kept = new Map();
function keep(key, make) {
  let node = kept.get(key);
  if (!node) {
    node = make();
    kept.set(key, node);
  }
  return node;
}

// A button that POSTs an action and says what came of it; shown only when can(scope).
function actionButton(label, scope, attrs, run) {
  if (!can(scope)) return null;
  const button = el("button", { type: "button", ...attrs, text: label });
  button.addEventListener("click", () => {
    button.disabled = true;
    run().catch((err) => toast(`${label}: ${err.message}`)).finally(() => { button.disabled = false; });
  });
  return button;
}

// Pause or resume a queue or a function (POST /queues/{q}/pause ... as `runner pause`).
function pauseButton(kind, name, paused) {
  const verb = paused ? "resume" : "pause";
  return keep(`${kind}:${name}:${verb}:${can("operate")}`, () => actionButton(paused ? "Resume" : "Pause", "operate",
    { class: paused ? "primary" : "", "data-action": verb, "data-target": `${kind}:${name}` },
    async () => {
      await api("POST", `/${kind === "queue" ? "queues" : "functions"}/${encodeURIComponent(name)}/${verb}`);
      toast(`${paused ? "Resumed" : "Paused"} ${kind} ${name}`);
      quietly(refreshQueues)();
    }));
}

// Hides what the token may not do (app.css keys off the body's classes), and says why.
function applyScopes(me) {
  state.me = me;
  document.body.classList.toggle("no-read", !can("read"));
  document.body.classList.toggle("no-operate", !can("operate"));
  const who = $("#whoami");
  who.textContent = me.auth ? `${me.name} · ${me.scopes.join(", ") || "no scopes"}` : "open API";
  who.hidden = false;
  const limits = [];
  if (!can("read")) limits.push("this token cannot read queues, jobs or dead letters");
  else if (!can("operate")) limits.push("read-only: requeue and delete need a token with the operate scope");
  $("#scope-note").textContent = limits.join("; ");
  $("#scope-note").hidden = !limits.length;
}

async function whoAmI() {
  applyScopes(await api("GET", "/whoami"));
}

// --- queues -----------------------------------------------------------------------------

function cell(value, cls, field) {
  return el("td", { class: cls || null, "data-field": field || null, text: value });
}

// A partitioned queue's partitions, one muted row each under the queue's sums.
function partitionRows(q) {
  return (q.partitions || []).map((p) => el("tr", { class: "partition", "data-queue-partition": `${q.name}/${p.partition}` },
    el("td", { text: `\u21b3 ${p.partition} {${p.tag}}${p.draining ? " draining" : ""}` }),
    el("td", { "data-field": "ready", text: p.ready }),
    el("td", { "data-field": "processing", text: p.processing }),
    el("td", {}),
    el("td", { "data-field": "scheduled", text: p.scheduled }),
    el("td", {}), el("td", {}), el("td", {}),
    el("td", { "data-field": "dead", class: p.dead ? "bad" : null, text: p.dead }),
    el("td", {}), el("td", {}), el("td", {}), el("td", {}), el("td", {}), el("td", { class: "operate-only" })));
}

function renderQueues(data) {
  const body = $("#queue-table tbody");
  const tput = state.throughput;
  body.replaceChildren(...data.queues.map((q) => {
    const series = tput && tput.queues[q.name] ? tput.queues[q.name].done : [];
    const perMin = series.length ? series[series.length - 1] : 0;
    return el("tr", { "data-queue": q.name },
      el("td", {}, el("a", { href: `#queue/${encodeURIComponent(q.name)}`, "data-queue-link": q.name },
        el("strong", { text: q.name }))),
      el("td", { "data-field": "ready", text: q.ready }),
      el("td", { "data-field": "processing", text: q.processing }),
      el("td", { "data-field": "lease_expired", class: q.lease_expired ? "bad" : null, text: q.lease_expired }),
      el("td", { "data-field": "scheduled", text: q.scheduled }),
      el("td", { "data-field": "scheduled_due", class: q.scheduled_due ? "warn" : null, text: q.scheduled_due }),
      el("td", { "data-field": "sleeping", text: q.sleeping }),
      el("td", { "data-field": "waiting", text: q.waiting }),
      el("td", { "data-field": "dead", class: q.dead ? "bad" : null, text: q.dead }),
      el("td", { "data-field": "oldest", text: age(q.oldest_ready_age_s) }),
      el("td", { "data-field": "done_per_min", text: perMin }),
      cell(`${q.visibility_timeout_s} s`),
      cell(q.concurrency),
      el("td", { "data-field": "paused", class: q.paused || (q.paused_functions || []).length ? "warn" : null,
                 text: q.paused ? "queue" : (q.paused_functions || []).join(", ") }),
      el("td", { class: "actions operate-only" }, pauseButton("queue", q.name, q.paused)));
  }).flatMap((row, i) => [row, ...partitionRows(data.queues[i])]));
  const rows = [];
  for (const q of data.queues) {
    for (const [name, f] of Object.entries(q.functions)) {
      const fnPaused = (q.paused_functions || []).includes(name);
      rows.push(el("tr", { "data-function": name },
        el("td", {}, el("a", { href: `#function/${encodeURIComponent(name)}`, text: name }),
          fnPaused ? el("span", { class: "warn", text: " paused" }) : null),
        cell(q.name), cell(f.enqueued), cell(f.succeeded), cell(f.retried),
        cell(f.dead, f.dead ? "bad" : null, "dead"), cell(f.cancelled, null, "cancelled"), cell(f.duplicates), cell(f.deferred), cell(f.lost, f.lost ? "warn" : null),
        cell(`${ms(f.latency.p50_ms)} / ${ms(f.latency.p95_ms)}`),
        cell(`${ms(f.run_time.p50_ms)} / ${ms(f.run_time.p95_ms)}`),
        el("td", { class: "actions operate-only" }, pauseButton("function", name, fnPaused))));
    }
  }
  $("#function-figures tbody").replaceChildren(...rows);
  $("#queues-updated").textContent = `updated ${clock()}`;
  trackLatency(data);
  queuesChanged(data.queues);  // pages.js: the overview and the page of a queue
  syncDeadQueues(data.queues.map((q) => q.name));
  jobsFollowQueues(data.queues);
}

// Mean latency of the jobs started between two refreshes, from the cumulative sums.
function trackLatency(data) {
  const now = Date.now() / 1000;
  const totals = {};
  for (const q of data.queues) {
    let count = 0;
    let sum = 0;
    for (const f of Object.values(q.functions)) {
      count += f.latency.count;
      sum += f.latency.sum_ms;
    }
    totals[q.name] = { count, sum };
  }
  const prev = state.lastFigures;
  if (prev) {
    for (const [name, t] of Object.entries(totals)) {
      const p = prev[name];
      if (!p) continue;
      const points = (state.latency[name] = state.latency[name] || []);
      const dn = t.count - p.count;
      points.push({ t: now, v: dn > 0 ? (t.sum - p.sum) / dn : null });
      if (points.length > 300) points.shift();
    }
  }
  state.lastFigures = totals;
  drawChart($("#latency-chart"), Object.entries(state.latency).map(([name, pts]) => ({
    name, points: pts.filter((p) => p.v !== null).map((p) => [p.t, p.v]),
  })), "ms");
}

async function refreshQueues() {
  const data = await api("GET", "/queues");
  state.queues = data.queues;
  renderQueues(data);
}

async function refreshThroughput() {
  state.throughput = await api("GET", "/throughput?minutes=60");
  const t = state.throughput;
  drawChart($("#throughput-chart"), Object.entries(t.queues).map(([name, fields]) => ({
    name, points: fields.done.map((v, i) => [t.times[i], v]),
  })), "jobs");
}

// --- charts (plain canvas) --------------------------------------------------------------

function drawChart(canvas, series, unit) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || canvas.width;
  const h = canvas.clientHeight || canvas.height;
  canvas.width = w * dpr;
  canvas.height = h * dpr;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const pad = { l: 48, r: 12, t: 22, b: 22 };
  const all = series.flatMap((s) => s.points);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#667085";
  if (!all.length) {
    ctx.fillText("no data yet", pad.l, h / 2);
    return;
  }
  const xs = all.map((p) => p[0]);
  const x0 = Math.min(...xs);
  const x1 = Math.max(...xs, x0 + 1);
  const step = niceStep(Math.max(...all.map((p) => p[1])) / 4, unit === "jobs" ? 1 : 0.25);
  const yMax = step * 4;
  const X = (x) => pad.l + ((x - x0) / (x1 - x0)) * (w - pad.l - pad.r);
  const Y = (y) => h - pad.b - (y / yMax) * (h - pad.t - pad.b);
  ctx.strokeStyle = "#e4e7ec";
  ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = step * i;
    ctx.beginPath();
    ctx.moveTo(pad.l, Y(y));
    ctx.lineTo(w - pad.r, Y(y));
    ctx.stroke();
    ctx.fillText(Number.isInteger(y) ? String(y) : y.toFixed(1), 4, Y(y) + 4);
  }
  ctx.fillText(unit, 4, pad.t - 8);
  ctx.fillText(clock(x0), pad.l, h - 6);
  const end = clock(x1);
  ctx.fillText(end, w - pad.r - ctx.measureText(end).width, h - 6);
  let legendX = pad.l;
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    s.points.forEach(([x, y], j) => (j ? ctx.lineTo(X(x), Y(y)) : ctx.moveTo(X(x), Y(y))));
    ctx.stroke();
    ctx.fillStyle = color;
    // Dots too, so a series of one point (a quiet queue) still shows.
    for (const [x, y] of s.points) {
      if (y > 0 || s.points.length < 30) ctx.fillRect(X(x) - 2, Y(y) - 2, 4, 4);
    }
    ctx.fillRect(legendX, 6, 10, 10);
    ctx.fillStyle = "#1d2430";
    ctx.fillText(s.name, legendX + 14, 15);
    legendX += ctx.measureText(s.name).width + 32;
  });
}

// A round tick step: 1, 2 or 5 times a power of ten, and never below ``least``.
function niceStep(raw, least) {
  if (!(raw > least)) return least;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

// --- functions --------------------------------------------------------------------------

function renderFunctions(data) {
  $("#load-errors").replaceChildren(...data.errors.map((e) =>
    el("p", { class: "error", text: `${e.path}${e.line ? ":" + e.line : ""}: ${e.message}` })));
  $("#function-list").replaceChildren(...data.functions.map((f) => {
    const opts = [
      ["queue", f.queue], ["max attempts", f.max_attempts], ["timeout", `${f.timeout} s`],
      ["backoff", `base ${f.backoff.base} s, cap ${f.backoff.cap} s, ${f.backoff.jitter} jitter`],
      ["idempotency key", f.idempotency_key || "—"], ["resource key", f.resource_key || "—"],
      ["versions", `${f.versions.join(", ")} (newest ${f.newest_version}${f.has_upgrade ? ", upgrade()" : ""})`],
    ];
    return el("div", { class: "fn", "data-function": f.type },
      el("h3", {}, el("a", { href: `#function/${encodeURIComponent(f.type)}`, "data-function-link": f.type },
        el("code", { text: f.type })), f.async ? el("span", { class: "muted", text: " async" }) : null),
      f.doc ? el("p", { class: "muted", text: f.doc }) : null,
      el("dl", {}, opts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })])),
      (f.schemas || []).map((s) => el("details", {},
        el("summary", { text: `schema v${s.version}` }), el("pre", { text: json(s.schema) }))));
  }));
}

async function refreshFunctions() {
  const data = await api("GET", "/functions?schemas=true");
  state.functions = data.functions;
  renderFunctions(data);
}

// --- schedules ----------------------------------------------------------------------------

function renderSchedules(data) {
  $("#schedules-empty").hidden = data.schedules.length > 0;
  $("#schedule-table tbody").replaceChildren(...data.schedules.map((s) => {
    const job = s.last_job;
    const jobCell = job
      ? el("td", { "data-field": "last_job" },
        jobLink(job.id), " ",
        el("span", { class: `status status-${job.status}`, "data-field": "last_job_status", text: job.status }))
      : el("td", { "data-field": "last_job", text: "—" });
    return el("tr", { "data-schedule": s.id },
      el("td", { "data-field": "id" }, el("code", { text: s.id }),
        s.id !== s.function ? " " : null,
        s.id !== s.function ? el("a", { href: `#function/${encodeURIComponent(s.function)}`, class: "muted", text: s.function }) : null),
      el("td", { "data-field": "cron" }, el("code", { text: s.cron })),
      el("td", { "data-field": "tz", text: s.tz }),
      el("td", { "data-field": "next", text: stamp(s.next) }),
      el("td", { "data-field": "last", text: stamp(s.last) }),
      jobCell,
      el("td", { "data-field": "state", class: s.state === "active" ? null : "warn", text: s.state }),
      el("td", { "data-field": "counts", text: `${s.counts.fired} / ${s.counts.missed} / ${s.counts.overlap}` }),
      el("td", { class: "actions operate-only" }, triggerButton(s.id)));
  }));
}

// A schedule's time as the API gives it (ISO 8601 text, or epoch seconds) in the one format.
function stamp(value) {
  if (value === null || value === undefined || value === "") return "—";
  if (typeof value === "number") return when(value);
  const t = Date.parse(value);
  return Number.isNaN(t) ? String(value) : when(t / 1000);
}

// Fire a schedule now (POST /schedules/{name}/trigger): one run outside its cron times.
function triggerButton(name) {
  return keep(`trigger:${name}:${can("operate")}`, () => actionButton("Trigger now", "operate",
    { "data-action": "trigger", "data-schedule": name },
    async () => {
      let r;
      try {
        r = await api("POST", `/schedules/${encodeURIComponent(name)}/trigger`);
      } catch (err) {
        if (err.status === 404 && !(err.problem && err.problem.type && /schedule/.test(err.problem.type))) {
          throw new Error("this server has no trigger route yet");
        }
        throw err;
      }
      const id = r && (r.id || (r.job && r.job.id));
      toast(id ? `Triggered ${name}: job ${id}` : `Triggered ${name}`);
      refreshSchedulesSoon();
    }));
}

async function refreshSchedules() {
  renderSchedules(await api("GET", "/schedules"));
}

// --- dead letters -------------------------------------------------------------------------

function syncDeadQueues(names) {
  const select = $("#dead-queue");
  if (select.options.length !== names.length) {
    select.replaceChildren(...names.map((n) => el("option", { value: n, text: n })));
  }
  let picked = false;
  if (!state.deadQueue || !names.includes(state.deadQueue)) {
    const withDead = state.queues.find((q) => q.dead > 0);
    state.deadQueue = withDead ? withDead.name : names[0];
    picked = true;
  }
  if (select.value !== state.deadQueue) select.value = state.deadQueue;
  if (picked) quietly(refreshDead)();
}

function deadRow(job) {
  const err = job.last_error;
  const errText = err ? `${err.type || "error"}: ${err.message || ""}` : "—";
  const del = el("button", { type: "button", class: "danger delete", text: "Delete" });
  del.addEventListener("click", () => deleteDead(job, del).catch((err) => toast(`Not deleted: ${err.message}`)));
  return el("tr", { "data-job-id": job.id },
    el("td", { class: "nowrap", text: when(job.finished_at) }),
    el("td", {},
      jobLink(job.id),
      el("div", { class: "muted", text: `${job.type} v${job.version}` })),
    el("td", { "data-field": "reason", text: job.reason || "—" }),
    el("td", { "data-field": "error" }, errText,
      err && err.traceback ? el("details", {}, el("summary", { text: "traceback" }), el("pre", { text: err.traceback })) : null),
    el("td", { "data-field": "attempts", text: `${job.attempt} / ${job.max_attempts}` }),
    el("td", { class: "payload" }, el("pre", { class: "payload", "data-field": "payload", text: listed(job, "payload") })),
    can("operate") ? el("td", { class: "actions" },
      el("button", { type: "button", class: "primary requeue", text: "Requeue",
        onclick: () => requeue(job, null).catch((err) => toast(`Not requeued: ${err.message}`)) }),
      el("button", { type: "button", class: "edit", text: "Edit & requeue",
        onclick: () => openEdit(job).catch((err) => toast(`Not opened: ${err.message}`)) }),
      del) : el("td", {}));
}

async function refreshDead() {
  if (!state.deadQueue || !pageIs("dead")) return;  // read while its page shows
  const q = encodeURIComponent(state.deadQueue);
  // By cursor: jobs that die meanwhile land before the first page, not on the next one.
  const cursor = state.deadCursors[state.deadCursors.length - 1];
  const page = await api("GET", `/dead/${q}?limit=${state.deadLimit}` + (cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""));
  const at = (state.deadCursors.length - 1) * state.deadLimit;
  const from = page.jobs.length ? at + 1 : 0;
  $("#dead-total").textContent = `${from}–${at + page.jobs.length} of ${page.total}`;
  $("#dead-prev").disabled = state.deadCursors.length === 1;
  $("#dead-next").disabled = !page.cursor;
  state.deadNext = page.cursor;
  const reasons = {};
  for (const j of page.jobs) reasons[j.reason || "?"] = (reasons[j.reason || "?"] || 0) + 1;
  $("#dead-reasons").replaceChildren(...Object.entries(reasons).map(([r, n]) => el("span", { text: `${r}: ${n}` })));
  const body = $("#dead-table tbody");
  // Re-render only when the page changed, so a row's buttons stay put between refreshes.
  const signature = `${state.deadQueue} ${cursor} ${can("operate")} ` + page.jobs.map((j) => `${j.id}:${j.attempt}`).join(",");
  if (signature === state.deadSignature) return;
  state.deadSignature = signature;
  if (!page.jobs.length) {
    body.replaceChildren(el("tr", {}, el("td", { colSpan: 7, class: "muted", text: "No dead jobs in this queue." })));
    return;
  }
  body.replaceChildren(...page.jobs.map(deadRow));
}

async function requeue(job, edited) {
  const path = `/dead/${encodeURIComponent(job.queue)}/${encodeURIComponent(job.id)}/requeue`;
  await api("POST", path, edited || undefined);
  toast(`Requeued ${job.id}`);
  refreshDead();
  lookUp(job.id);
}

async function deleteDead(job, button) {
  // Two clicks: the first arms the button, so one stray click deletes nothing.
  if (!button.classList.contains("armed")) {
    button.classList.add("armed");
    button.textContent = "Confirm delete";
    setTimeout(() => { button.classList.remove("armed"); button.textContent = "Delete"; }, 4000);
    return;
  }
  await api("DELETE", `/dead/${encodeURIComponent(job.queue)}/${encodeURIComponent(job.id)}`);
  toast(`Deleted ${job.id}`);
  refreshDead();
}

async function openEdit(listedJob) {
  // A listed payload may be a preview: edit the whole one.
  const job = listedJob.truncated && listedJob.truncated.payload
    ? { ...(await api("GET", `/jobs/${encodeURIComponent(listedJob.id)}`)), queue: listedJob.queue }
    : listedJob;
  state.editing = job;
  $("#edit-id").textContent = plain(job.id);
  $("#edit-version").value = job.version || "";
  $("#edit-payload").value = json(job.payload);
  $("#edit-errors").replaceChildren();
  $("#edit").showModal();
}

async function submitEdit(event) {
  event.preventDefault();
  const job = state.editing;
  const errors = $("#edit-errors");
  // The payload goes as the box holds it (Verbatim): parsed only to check it is JSON.
  const text = $("#edit-payload").value;
  try {
    JSON.parse(text);
  } catch (err) {
    errors.replaceChildren(el("li", { text: `Not valid JSON: ${err.message}` }));
    return;
  }
  const version = parseInt($("#edit-version").value, 10);
  const body = new Verbatim(`{"payload": ${text}${version > 0 ? `, "version": ${version}` : ""}}`);
  try {
    await requeue(job, body);
  } catch (err) {
    const p = err.problem || {};
    const items = (p.errors || []).map((e) => el("li", { text: `${e.path}: ${e.message}` }));
    errors.replaceChildren(el("li", { text: err.message }), ...items);
    return;
  }
  $("#edit").close();
}

// --- wiring -----------------------------------------------------------------------------------

async function refreshHealth() {
  const pill = $("#health");
  try {
    const resp = await fetch("/healthz", { cache: "no-store" });
    pill.textContent = resp.ok ? "Redis reachable" : "Redis unreachable";
    pill.className = `pill ${resp.ok ? "ok" : "bad"}`;
  } catch (err) {
    pill.textContent = "web process unreachable";
    pill.className = "pill bad";
  }
}

function quietly(fn) {
  return () => fn().catch((err) => {
    if (err.status !== 401) console.warn(err);
  });
}

function refreshAll() {
  if (!can("read")) return;
  quietly(refreshThroughput)().then(quietly(refreshQueues));
  quietly(refreshFunctions)();
  quietly(refreshSchedules)();
  route();
}

// Calls fn at most once per ms, and once more after the last call of a burst, so the
// final state of a burst of changes is always fetched.
function throttle(fn, ms) {
  let last = 0;
  let timer = null;
  return () => {
    const wait = last + ms - Date.now();
    if (wait <= 0) {
      last = Date.now();
      fn();
    } else if (!timer) {
      timer = setTimeout(() => { timer = null; last = Date.now(); fn(); }, wait);
    }
  };
}

// What the stream says changed, read again: the stream carries the figures and the open
// job; the lists and the schedules come from their own routes, at most every second or two.
const refreshDeadSoon = throttle(quietly(() => refreshDead()), 1000);
const refreshSchedulesSoon = throttle(quietly(() => refreshSchedules()), 2000);

function every(seconds, fn) {
  setInterval(() => {
    if (!state.loginOpen && !document.hidden && can("read")) fn();
  }, seconds * 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  $("#login-form").addEventListener("submit", signIn);
  $("#login").addEventListener("cancel", (e) => e.preventDefault());
  $("#logout").addEventListener("click", signOut);
  $("#logout").hidden = !state.token;
  $("#edit-form").addEventListener("submit", submitEdit);
  $("#edit-cancel").addEventListener("click", () => $("#edit").close());
  window.addEventListener("hashchange", () => route());
  initJobs();
  $("#dead-queue").addEventListener("change", (e) => {
    go(`#dead/${encodeURIComponent(e.target.value)}`);
  });
  $("#dead-prev").addEventListener("click", () => {
    if (state.deadCursors.length > 1) state.deadCursors.pop();
    quietly(refreshDead)();
  });
  $("#dead-next").addEventListener("click", () => {
    if (state.deadNext) state.deadCursors.push(state.deadNext);
    quietly(refreshDead)();
  });
  refreshHealth();
  setInterval(() => document.hidden || refreshHealth(), 5000);  // no token needed
  quietly(whoAmI)().then(() => { refreshAll(); liveStart(); });
  // Slow-moving panels; everything else follows the event stream.
  every(15, quietly(refreshThroughput));
  every(30, quietly(refreshFunctions));
});
