// The router and the pages that are not a panel of their own elsewhere. Every view has a
// URL under the fragment, so a link opens it directly, a reload keeps it, and the back and
// forward buttons move between views (hashchange):
//
//   #overview             the totals, what needs a look, the charts
//   #queues, #queue/Q     every queue's figures; one queue's, its partitions and functions
//   #jobs/S?queue=&type=  the jobs of a status      #job/ID     a job's page (job.js)
//   #dead, #dead/Q        a queue's dead letters     #group/ID?status=  a group, its members
//   #schedules            #functions, #function/F (with its invoke form)
//   #workers              #events                    #audit
"use strict";

const PAGES = {
  overview: () => { renderOverview(); quietly(countWorkers)(); },
  queues: () => {},
  queue: (arg) => (arg ? renderQueuePage(arg) : location.replace("#queues")),
  jobs: (arg, params) => showJobs(arg || "queued", params),
  job: (arg) => (arg ? showJob(arg) : fill($("#job-view"), el("p", { class: "muted", text: "No job open: open one from a list, a search or a link." }))),
  group: (arg, params) => (arg ? showGroupPage(arg, params.get("status") || "") : location.replace("#jobs/queued")),
  dead: (arg) => {
    if (arg) state.deadQueue = arg;
    state.deadCursors = [null];
    state.deadSignature = "";
    fill($("#dead-table tbody"), el("tr", {}, el("td", { colSpan: 7, class: "muted", text: "Reading…" })));
    if (state.deadQueue) $("#dead-queue").value = state.deadQueue;
    quietly(refreshDead)();
  },
  schedules: () => quietly(refreshSchedules)(),
  functions: () => quietly(refreshFunctions)(),
  function: (arg) => (arg ? showFunctionPage(arg) : location.replace("#functions")),
  workers: () => showWorkers(),
  events: () => quietly(showEvents)(),
  audit: () => { pages.auditCursors = [null]; quietly(showAudit)(); },
};

// auditCursors: the cursor of each page read so far (null: the first); auditNext: the next page's.
const pages = { name: "", arg: "", auditCursors: [null], auditNext: null, auditLimit: 50, workersTimer: null,
  memberCursors: [null], memberNext: null };

// "#jobs/dead?queue=fast" -> {name: "jobs", arg: "dead", params}
function parseHash(hash) {
  const text = (hash || "").replace(/^#\/?/, "");
  const [path, query] = text.split("?", 2);
  const slash = path.indexOf("/");
  let name = slash < 0 ? path : path.slice(0, slash);
  let arg = slash < 0 ? "" : path.slice(slash + 1);
  try {
    arg = decodeURIComponent(arg);
  } catch (err) {
    arg = "";
  }
  if (!Object.hasOwn(PAGES, name)) { name = "overview"; arg = ""; }
  return { name, arg, params: new URLSearchParams(query || "") };
}

function pageIs(name) {
  return pages.name === name;
}

// A move to another view: a new history entry, so back returns here.
function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function route() {
  const { name, arg, params } = parseHash(location.hash);
  const moved = name !== pages.name || arg !== pages.arg;
  if (pages.name === "job" && (name !== "job" || arg !== pages.arg)) leaveJob();
  if (pages.name === "workers" && name !== "workers") clearTimeout(pages.workersTimer);
  pages.name = name;
  pages.arg = arg;
  for (const section of document.querySelectorAll("main > section[data-page]")) {
    section.hidden = section.dataset.page !== name;
  }
  for (const a of document.querySelectorAll("#nav a[data-nav]")) {
    if (a.dataset.nav.split(" ").includes(name)) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  document.title = `${arg ? `${arg} · ` : ""}${name} · runner`;
  if (moved) window.scrollTo(0, 0);
  if (!can("read")) return;
  PAGES[name](arg, params);
}

// --- the overview -------------------------------------------------------------------------

function sum(queues, field) {
  return queues.reduce((n, q) => n + (q[field] || 0), 0);
}

function tile(label, value, href, cls, title) {
  return el("a", { class: `tile ${cls || ""}`, href, title: title || null, "data-tile": label },
    el("span", { class: "tile-value", text: Number(value).toLocaleString() }), el("span", { class: "tile-label", text: label }));
}

function renderOverview() {
  const qs = state.queues || [];
  const workers = pages.workers;
  fill($("#overview-tiles"), 
    tile("ready", sum(qs, "ready"), "#jobs/queued"),
    tile("in flight", sum(qs, "processing"), "#jobs/processing"),
    tile("scheduled", sum(qs, "scheduled"), "#jobs/scheduled", null, "Delayed, retrying or deferred"),
    tile("dead", sum(qs, "dead"), "#dead", sum(qs, "dead") ? "bad" : ""),
    tile("past lease", sum(qs, "lease_expired"), "#jobs/processing", sum(qs, "lease_expired") ? "bad" : ""),
    tile("queues", qs.length, "#queues"),
    workers ? tile("workers", workers.length, "#workers", workers.length ? "" : "warn") : null);
  const alerts = [];
  for (const q of qs) {
    const link = el("a", { href: `#queue/${encodeURIComponent(q.name)}`, text: q.name });
    if (q.paused) alerts.push(["warn", ["queue ", link, " is paused"]]);
    for (const f of q.paused_functions || []) {
      alerts.push(["warn", ["function ", el("a", { href: `#function/${encodeURIComponent(f)}`, text: f }), ` is paused (queue ${q.name})`]]);
    }
    if (q.lease_expired) alerts.push(["bad", ["queue ", link, ` has ${q.lease_expired} job(s) past their lease: is their worker alive?`]]);
    if (q.scheduled_due) alerts.push(["warn", ["queue ", link, ` has ${q.scheduled_due} job(s) due but not promoted: is a worker running?`]]);
    if (q.dead) alerts.push(["bad", ["queue ", link, ` holds ${q.dead} dead letter(s): `, el("a", { href: `#dead/${encodeURIComponent(q.name)}`, text: "see why" })]]);
  }
  fill($("#overview-alerts"), alerts.length
    ? el("ul", { class: "alerts" }, alerts.map(([cls, parts]) => el("li", { class: cls }, parts)))
    : el("p", { class: "muted", text: qs.length ? "Nothing needs a look: no dead letters, pauses or stalled leases." : "" }));
  $("#overview-updated").textContent = qs.length ? `updated ${clock()}` : "";
}

// The figures moved (the stream, or GET /queues): the pages built on them follow.
function queuesChanged() {
  if (pageIs("overview")) renderOverview();
  else if (pageIs("queue")) renderQueuePage(pages.arg);
  else if (pageIs("function") && pages.fn) renderFunctionState(pages.fn);
}

// --- a queue --------------------------------------------------------------------------------

function figureList(pairs) {
  return el("dl", { class: "figures-list" }, pairs.flatMap(([k, v, field, cls]) =>
    [el("dt", { text: k }), el("dd", { "data-field": field || null, class: cls || null }, v)]));
}

function renderQueuePage(name) {
  const view = $("#queue-view");
  const q = (state.queues || []).find((x) => x.name === name);
  if (!q) {
    fill(view, el("h2", {}, "Queue ", el("code", { text: name })),
      el("p", { class: state.queues && state.queues.length ? "error" : "muted",
        text: state.queues && state.queues.length ? `No queue ${name} in runner.toml.` : "Reading the figures…" }));
    return;
  }
  const base = `queue=${encodeURIComponent(name)}`;
  const statusLinks = [["queued", q.ready], ["scheduled", q.scheduled], ["processing", q.processing], ["deferred", null],
    ["sleeping", q.sleeping], ["waiting", q.waiting], ["done", null], ["cancelled", q.cancelled]].map(([s, n]) =>
    el("a", { href: `#jobs/${s}?${base}`, class: "chip", "data-status-link": s }, s, n === null || n === undefined ? null : ` ${n}`));
  const fns = Object.entries(q.functions).map(([fn, f]) => {
    const paused = (q.paused_functions || []).includes(fn);
    return el("tr", { "data-function": fn },
      el("td", {}, el("a", { href: `#function/${encodeURIComponent(fn)}`, text: fn }), paused ? el("span", { class: "warn", text: " paused" }) : null),
      el("td", { text: f.enqueued }), el("td", { text: f.succeeded }), el("td", { text: f.retried }),
      el("td", { class: f.dead ? "bad" : null, text: f.dead }),
      el("td", { text: `${ms(f.latency.p50_ms)} / ${ms(f.latency.p95_ms)}` }),
      el("td", { text: `${ms(f.run_time.p50_ms)} / ${ms(f.run_time.p95_ms)}` }),
      el("td", { class: "actions" }, pauseButton("function", fn, paused)));
  });
  fill(view,
    el("div", { class: "page-head" },
      el("h2", {}, "Queue ", el("code", { text: name }),
        q.paused ? el("span", { class: "pill warn", "data-field": "paused", text: "paused" }) : null),
      el("div", { class: "actions" }, pauseButton("queue", name, q.paused))),
    figureList([
      ["ready", q.ready, "ready"], ["in flight", q.processing, "processing"],
      ["past lease", q.lease_expired, "lease_expired", q.lease_expired ? "bad" : null],
      ["scheduled", q.scheduled, "scheduled"], ["due, not promoted", q.scheduled_due, "scheduled_due", q.scheduled_due ? "warn" : null],
      ["sleeping", q.sleeping, "sleeping"], ["waiting", q.waiting, "waiting"],
      ["dead", el("a", { href: `#dead/${encodeURIComponent(name)}`, text: String(q.dead) }), "dead", q.dead ? "bad" : null],
      ["oldest wait", age(q.oldest_ready_age_s), "oldest"], ["lease", `${q.visibility_timeout_s} s`],
      ["concurrency", String(q.concurrency)],
      ["paused functions", (q.paused_functions || []).join(", ") || "—"],
    ]),
    el("h3", { text: "Jobs" }), el("div", { class: "chips" }, statusLinks),
    (q.partitions || []).length ? [el("h3", { text: `Partitions (${q.partitions.length})` }),
      el("table", { class: "figures" },
        el("thead", {}, el("tr", {}, ["Partition", "Tag", "Ready", "In flight", "Scheduled", "Dead"].map((h) => el("th", { text: h })))),
        el("tbody", {}, q.partitions.map((p) => el("tr", {},
          el("td", { text: `${p.partition}${p.draining ? " (draining)" : ""}` }), el("td", {}, el("code", { text: `{${p.tag}}` })),
          el("td", { text: p.ready }), el("td", { text: p.processing }), el("td", { text: p.scheduled }),
          el("td", { class: p.dead ? "bad" : null, text: p.dead })))))] : null,
    el("h3", { text: "Functions" }),
    fns.length ? el("table", { class: "figures" },
      el("thead", {}, el("tr", {}, ["Function", "Enqueued", "Succeeded", "Retried", "Dead-lettered", "Latency p50 / p95",
        "Run p50 / p95", ""].map((h) => el("th", { text: h })))),
      el("tbody", {}, fns)) : el("p", { class: "muted", text: "No function runs on this queue." }));
}

// --- a function and its invoke form ------------------------------------------------------

async function showFunctionPage(name) {
  const view = $("#function-view");
  pages.fn = null;
  fill(view, el("h2", {}, "Function ", el("code", { text: name })), el("p", { class: "muted", text: "Reading…" }));
  let f;
  try {
    f = await api("GET", `/functions/${encodeURIComponent(name)}`);
  } catch (err) {
    if (!pageIs("function") || pages.arg !== name) return;
    fill(view, el("h2", {}, "Function ", el("code", { text: name })),
      el("p", { class: "error", "data-function-gone": name, text: err.status === 404 ? `No function ${name} is loaded.` : err.message }));
    return;
  }
  if (!pageIs("function") || pages.arg !== name) return;
  pages.fn = f;
  const opts = [
    ["queue", el("a", { href: `#queue/${encodeURIComponent(f.queue)}`, text: f.queue })], ["max attempts", String(f.max_attempts)],
    ["timeout", `${f.timeout} s`],
    ["backoff", `base ${f.backoff.base} s, cap ${f.backoff.cap} s, ${f.backoff.jitter} jitter`],
    ["idempotency key", f.idempotency_key || "—"], ["resource key", f.resource_key || "—"],
    ["versions", `${f.versions.join(", ")} (newest ${f.newest_version}${f.has_upgrade ? ", upgrade()" : ""})`],
  ];
  if (f.flow && typeof f.flow === "object") {
    for (const [k, v] of Object.entries(f.flow)) {
      if (k !== "paused" && v !== null && v !== undefined && typeof v !== "object") opts.push([k.replace(/_/g, " "), String(v)]);
    }
  }
  const jobs = `type=${encodeURIComponent(f.type)}&queue=${encodeURIComponent(f.queue)}`;
  fill(view,
    el("div", { class: "page-head" },
      el("h2", {}, "Function ", el("code", { text: f.type }), f.async ? el("span", { class: "muted", text: " async" }) : null,
        el("span", { id: "function-paused" })),
      el("div", { class: "actions", id: "function-actions" })),
    f.doc ? el("p", { class: "muted", text: f.doc }) : null,
    el("div", { class: "split" },
      el("div", {},
        el("dl", { class: "figures-list" }, opts.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", {}, v)])),
        el("div", { class: "chips" }, ["queued", "processing", "done", "dead"].map((s) =>
          el("a", { class: "chip", href: `#jobs/${s}?${jobs}`, text: `${s} jobs` }))),
        (f.schemas || []).map((s) => el("details", {},
          el("summary", { text: `schema v${s.version}` }), el("pre", { text: json(s.schema) })))),
      invokeForm(f)));
  renderFunctionState(f);
}

// The pause state of the function open, from the queue figures (they come every second).
function renderFunctionState(f) {
  const q = (state.queues || []).find((x) => x.name === f.queue);
  const paused = Boolean(q && (q.paused_functions || []).includes(f.type));
  const tag = $("#function-paused");
  if (!tag) return;
  fill(tag, paused ? el("span", { class: "pill warn", "data-field": "paused", text: "paused" }) : "");
  const box = $("#function-actions");
  const button = pauseButton("function", f.type, paused);
  if (box.firstChild !== button) fill(box, button || "");
}

// A payload to start from: the schema's first example, or its required fields.
function samplePayload(f) {
  const newest = (f.schemas || []).find((s) => s.version === f.newest_version) || (f.schemas || [])[0];
  const schema = newest && newest.schema;
  if (!schema || typeof schema !== "object") return {};
  if (Array.isArray(schema.examples) && schema.examples.length) return schema.examples[0];
  const out = {};
  for (const key of schema.required || []) {
    const t = schema.properties && schema.properties[key] && schema.properties[key].type;
    out[key] = t === "integer" || t === "number" ? 0 : t === "boolean" ? false : t === "array" ? [] : t === "object" ? {} : "";
  }
  return out;
}

const INVOKE_WAIT_S = 10;

function invokeForm(f) {
  if (!can(`enqueue:${f.type}`)) return el("p", { class: "muted", text: "This token may not enqueue this function." });
  const payload = el("textarea", { id: "invoke-payload", rows: 10, spellcheck: false, value: json(samplePayload(f)) });
  const version = el("select", { id: "invoke-version" },
    f.versions.slice().reverse().map((v) => el("option", { value: v, text: `v${v}${v === f.newest_version ? " (newest)" : ""}` })));
  const out = el("div", { id: "invoke-result", role: "status" });
  const submit = el("button", { type: "submit", id: "invoke-submit", class: "primary", text: "Invoke" });
  const form = el("form", { id: "invoke-form", class: "invoke" },
    el("h3", { text: "Invoke with a test payload" }),
    el("p", { class: "muted", text: `Validated against the schema, enqueued as a real job, and its result shown when it ends (the page waits up to ${INVOKE_WAIT_S} s at a time).` }),
    el("label", {}, "Payload (JSON)", payload), el("label", {}, "Version ", version), submit, out);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    submit.disabled = true;
    invoke(f, payload.value, parseInt(version.value, 10), out).finally(() => { submit.disabled = false; });
  });
  return form;
}

function invokeOutcome(job) {
  const rows = [["job", jobLink(job.id)], ["status", statusBadge(job.status)]];
  if (job.status === "done") rows.push(["result", el("pre", { "data-field": "result", text: json(job.result) })]);
  if (job.last_error) rows.push(["error", errorBlock(job.last_error)]);
  if (job.started_at && job.finished_at) rows.push(["ran", `${Math.round((job.finished_at - job.started_at) * 1000)} ms`]);
  return el("table", { class: "job", "data-job-id": job.id }, rows.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", {}, v))));
}

async function invoke(f, text, version, out) {
  // The payload goes as the box holds it (Verbatim): parsed only to check it is JSON.
  try {
    JSON.parse(text);
  } catch (err) {
    fill(out, el("p", { class: "error", text: `Not valid JSON: ${err.message}` }));
    return;
  }
  fill(out, el("p", { class: "muted", text: "Enqueued; waiting for its end…" }));
  let job;
  try {
    job = await api("POST", `/jobs/${encodeURIComponent(f.type)}?version=${version}&wait=${INVOKE_WAIT_S}`, new Verbatim(text));
  } catch (err) {
    const p = err.problem || {};
    fill(out, el("p", { class: "error", text: `Not enqueued: ${err.message}` }),
      el("ul", { class: "error", "data-field": "errors" }, (p.errors || []).map((e) => el("li", { text: `${e.path}: ${e.message}` }))));
    return;
  }
  // Not ended within the wait: ask again (GET /jobs/{id}?wait=) while the page stays here.
  while (!ENDED.has(job.status) && pageIs("function") && pages.arg === f.type) {
    fill(out, el("p", { class: "muted", text: `Job ${job.id} is ${job.status}; still waiting…` }), invokeOutcome(job));
    job = await api("GET", `/jobs/${encodeURIComponent(job.id)}?wait=${INVOKE_WAIT_S}`);
  }
  fill(out, invokeOutcome(job));
}

// --- workers ----------------------------------------------------------------------------------

// For the overview's tile: how many are alive (none shown where the server has no route).
async function countWorkers() {
  try {
    pages.workers = (await api("GET", "/workers")).workers;
  } catch (err) {
    pages.workers = null;
  }
  if (pageIs("overview")) renderOverview();
}

async function showWorkers() {
  clearTimeout(pages.workersTimer);
  const view = $("#workers-view");
  let data;
  try {
    data = await api("GET", "/workers");
  } catch (err) {
    if (!pageIs("workers")) return;
    fill(view, el("p", { class: err.status === 404 ? "muted" : "error", "data-workers": "unavailable",
      text: err.status === 404 ? "Not available: this server has no GET /workers (an older release)." : `Could not read the workers: ${err.message}` }));
    return;
  }
  pages.workers = data.workers;
  if (!pageIs("workers")) return;
  const rows = data.workers.map((w) => el("tr", { "data-worker": w.id },
    el("td", {}, el("code", { text: w.id })), el("td", { text: `${w.host || "—"}${w.pid ? ` (pid ${w.pid})` : ""}` }),
    el("td", {}, (w.queues || []).map((q) => [el("a", { href: `#queue/${encodeURIComponent(q)}`, text: q }), " "])),
    el("td", { text: `${w.concurrency ?? "—"}${w.isolation ? `, ${w.isolation}` : ""}` }),
    el("td", { class: "nowrap", text: whenAgo(w.started_at) }), el("td", { class: "nowrap", text: whenAgo(w.last_seen) }),
    el("td", { "data-field": "running" }, (w.running || []).length
      ? el("ul", { class: "plain" }, w.running.map((r) => el("li", {}, jobLink(r.id), ` ${r.type || ""}`,
        r.started ? el("span", { class: "muted", text: ` for ${age(Date.now() / 1000 - r.started)}` }) : null)))
      : el("span", { class: "muted", text: "idle" }))));
  fill(view, damagedNote(data), data.workers.length
    ? el("table", { class: "list", id: "worker-table" },
      el("thead", {}, el("tr", {}, ["Worker", "Host", "Queues", "Concurrency", "Started", "Last seen", "Running now"].map((h) => el("th", { text: h })))),
      el("tbody", {}, rows))
    : data.damaged_keys ? null : el("p", { class: "muted", text: "No worker is alive: jobs wait until one starts (runner worker)." }));
  pages.workersTimer = setTimeout(() => pageIs("workers") && !document.hidden && quietly(showWorkers)(), 5000);
}

// --- events -----------------------------------------------------------------------------------

async function showEvents() {
  const view = $("#events-view");
  const data = await api("GET", "/events?limit=100");
  if (!pageIs("events")) return;
  if (!data.events.length) {
    fill(view, damagedNote(data), el("p", { class: "muted", text: "No event emitted lately (POST /events/{name}, runner emit)." }));
    return;
  }
  fill(view, damagedNote(data), el("table", { class: "list", id: "event-table" },
    el("thead", {}, el("tr", {}, ["At", "Event", "Id", "Data", "Jobs started"].map((h) => el("th", { text: h })))),
    el("tbody", {}, data.events.map((e) => el("tr", { "data-event": e.id || "" },
      el("td", { class: "nowrap", text: when(e.at ?? (e.at_ms ? e.at_ms / 1000 : e.ts)) }),
      el("td", {}, el("code", { text: textOf(e.name) })), el("td", {}, el("code", { class: "muted", text: textOf(e.id) || "—" })),
      el("td", { class: "payload" }, e.data === undefined ? "—" : el("pre", { class: "payload", text: json(e.data) })),
      el("td", {}, eventJobs(e.jobs)))))));
}

// The jobs an event started: links (the server hands on only objects with an id).
function eventJobs(jobs) {
  const listed = (Array.isArray(jobs) ? jobs : []).map((j) => idOf(j) && [j, idOf(j)]).filter(Boolean);
  return listed.length
    ? el("ul", { class: "plain" }, listed.map(([j, id]) => el("li", {}, jobLink(id), j.type ? ` ${textOf(j.type)}` : "")))
    : el("span", { class: "muted", text: "none subscribed" });
}

// --- audit ------------------------------------------------------------------------------------

const AUDIT_SHOWN = new Set(["at", "last_at", "repeats", "action", "by", "queue", "id", "job_id", "ids", "count",
  "target", "function", "name"]);

async function showAudit() {
  // By cursor: actions taken meanwhile land before the first page, not on the next one.
  const cursor = pages.auditCursors[pages.auditCursors.length - 1];
  const data = await api("GET", `/audit?limit=${pages.auditLimit}` + (cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""));
  if (!pageIs("audit")) return;
  const at = (pages.auditCursors.length - 1) * pages.auditLimit;
  const from = data.entries.length ? at + 1 : 0;
  $("#audit-total").textContent = `${from}–${at + data.entries.length} of ${data.total}`;
  $("#audit-prev").disabled = pages.auditCursors.length === 1;
  $("#audit-next").disabled = !data.cursor;
  pages.auditNext = data.cursor;
  const view = $("#audit-view");
  if (!data.entries.length) {
    fill(view, damagedNote(data), el("p", { class: "muted", text: "No operator action yet (requeue, delete, cancel, pause, resume, run now, trigger)." }));
    return;
  }
  fill(view, damagedNote(data), el("table", { class: "list", id: "audit-table" },
    el("thead", {}, el("tr", {}, ["At", "By", "Action", "On", "Detail"].map((h) => el("th", { text: h })))),
    el("tbody", {}, data.entries.map((e) => {
      const one = e.job_id || e.id;
      const ids = Array.isArray(e.ids) ? e.ids : one ? [one] : [];
      const on = [];
      if (e.function) {
        on.push("function ", el("a", { href: `#function/${encodeURIComponent(textOf(e.function))}`, text: textOf(e.function) }), " in ");
      }
      if (e.queue) on.push(el("a", { href: `#queue/${encodeURIComponent(textOf(e.queue))}`, text: `queue ${textOf(e.queue)}` }), " ");
      for (const k of ["target", "name"]) if (e[k]) on.push(el("code", { text: textOf(e[k]) }), " ");
      if (ids.length) {
        // (an id that is no text, from another writer, is shown as its JSON, not linked)
        on.push(...ids.slice(0, 5).flatMap((i) => [typeof i === "string" ? jobLink(i) : el("code", { text: textOf(i) }), " "]));
        if (ids.length > 5) on.push(el("span", { class: "muted", text: `and ${ids.length - 5} more` }));
      }
      const rest = Object.fromEntries(Object.entries(e).filter(([k]) => !AUDIT_SHOWN.has(k)));
      return el("tr", { "data-audit-action": e.action },
        // A folded entry: the caller's repeats of one action on one target, first to last.
        el("td", { class: "nowrap", text: e.last_at ? `${when(e.at)} – ${when(e.last_at)}` : when(e.at) }),
        el("td", { text: textOf(e.by) || "—" }),
        el("td", {}, el("strong", { text: textOf(e.action) }), Number.isInteger(e.repeats) && e.repeats > 1 ? ` ${e.repeats} times` : "",
          // (the jobs it covered, where more than its repeats: a fold of single cancels
          // is "cancel 3 times", a fold of bulk ones "bulk 3 times ×1200")
          e.count > Math.max(1, Number.isInteger(e.repeats) ? e.repeats : 1) ? ` ×${e.count}` : ""),
        el("td", {}, on.length ? on : "—"),
        el("td", { class: "muted", text: Object.keys(rest).length ? detailText(rest) : "" }));
    }))));
}

// --- a group ----------------------------------------------------------------------------------

const MEMBERS_PAGE = 50;
// The outcomes a group's members are listed by (GET /groups/{id}/members?status=).
const MEMBER_FILTERS = [["", "all", "total"], ["dead", "dead", "dead"], ["cancelled", "cancelled", "cancelled"],
  ["done", "done", "done"], ["pending", "pending", "pending"]];

async function showGroupPage(id, status) {
  const view = $("#group-view");
  fill(view, el("h2", {}, "Group ", el("code", { text: id })), el("p", { class: "muted", text: "Reading…" }));
  let g;
  try {
    g = await api("GET", `/groups/${encodeURIComponent(id)}`);
  } catch (err) {
    if (pageIs("group") && pages.arg === id) {
      fill(view, el("h2", {}, "Group ", el("code", { text: id })),
        el("p", { class: "error", "data-group-gone": id, text: err.status === 404 ? `No group ${id}.` : err.message }));
    }
    return;
  }
  if (!pageIs("group") || pages.arg !== id) return;
  const rows = [];
  const seen = new Set(["id", "members"]);
  const total = g.total || 0;
  if (total) {
    const done = g.done || 0;
    rows.push(["progress", el("span", { class: "progress" }, el("progress", { max: total, value: done + (g.dead || 0) }),
      ` ${done} done, ${g.dead || 0} dead, ${g.pending ?? total - done - (g.dead || 0)} pending of ${total}`)]);
    for (const k of ["total", "done", "dead", "pending"]) seen.add(k);
  }
  if (g.status) { rows.push(["status", statusBadge(g.status)]); seen.add("status"); }
  const then = g.then || g.then_job;
  if (then) {
    // A then-job another writer's record leaves unreadable has no id: said so, with no status.
    const thenId = idOf(then);
    rows.push(["then", thenId
      ? el("span", {}, jobLink(thenId), then.status ? [" ", statusBadge(then.status)] : null)
      : el("span", { class: "muted", "data-field": "then", text: "unreadable (the group's record is damaged)" })]);
    seen.add("then"); seen.add("then_job");
  }
  for (const [k, v] of Object.entries(g)) {
    if (seen.has(k)) continue;
    const text = typeof v === "number" && /(_at|until)$/.test(k) ? when(v) : typeof v === "string" ? v : compact(v);
    rows.push([k.replace(/_/g, " "), text]);
  }
  pages.memberCursors = [null];
  const chips = MEMBER_FILTERS.map(([s, label, field]) => el("a", {
    class: s === status ? "chip current" : "chip", "data-member-filter": s || "all",
    href: `#group/${encodeURIComponent(id)}${s ? `?status=${s}` : ""}`,
  }, `${label} ${typeof g[field] === "number" ? g[field] : ""}`.trim()));
  fill(view,
    el("h2", {}, "Group ", el("code", { text: id })),
    el("table", { class: "job", "data-group-id": id }, rows.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", {}, v)))),
    el("h3", { text: "Members" }), el("div", { class: "chips" }, chips),
    el("div", { id: "group-members" }, el("p", { class: "muted", text: "Reading the members…" })),
    el("div", { class: "toolbar" },
      el("button", { type: "button", id: "members-first", text: "First page", disabled: true,
        onclick: () => { pages.memberCursors = [null]; quietly(() => showMembers(id, status))(); } }),
      el("button", { type: "button", id: "members-next", text: "Next page", disabled: true,
        onclick: () => { if (pages.memberNext) pages.memberCursors.push(pages.memberNext); quietly(() => showMembers(id, status))(); } })));
  await showMembers(id, status);
}

// A page of the group's members (GET /groups/{id}/members), each linked to its job: the
// outcome the group counted for it (dead, cancelled, done), or pending.
async function showMembers(id, status) {
  const cursor = pages.memberCursors[pages.memberCursors.length - 1];
  const query = new URLSearchParams({ limit: MEMBERS_PAGE });
  if (status) query.set("status", status);
  if (cursor) query.set("cursor", cursor);
  let data;
  try {
    data = await api("GET", `/groups/${encodeURIComponent(id)}/members?${query}`);
  } catch (err) {
    if (!pageIs("group") || pages.arg !== id || !$("#group-members")) return;
    fill($("#group-members"), el("p", { class: err.status === 404 || err.status === 405 ? "muted" : "error",
      text: err.status === 404 || err.status === 405 ? "This server lists no members (an earlier release)."
        : `Could not read the members: ${err.message}` }));
    return;
  }
  const box = $("#group-members");
  if (!pageIs("group") || pages.arg !== id || !box) return;
  pages.memberNext = data.cursor;
  $("#members-first").disabled = pages.memberCursors.length === 1;
  $("#members-next").disabled = !data.cursor;
  if (!data.members.length) {
    fill(box, el("p", { class: "muted", "data-members": "none", text: data.listed === false
      ? "Not listed: the group was written by an earlier release, before members were listed."
      : status ? `No ${status} member${cursor ? " past the last page" : ""}.` : "No member." }));
    return;
  }
  fill(box, el("table", { class: "list", id: "member-table" },
    el("thead", {}, el("tr", {}, ["#", "Job", "Outcome"].map((h) => el("th", { text: h })))),
    el("tbody", {}, data.members.map((m) => el("tr", { "data-member": m.member, "data-job-id": m.id },
      el("td", { text: String(m.member) }), el("td", {}, jobLink(m.id)), el("td", {}, statusBadge(m.status)))))));
}

document.addEventListener("DOMContentLoaded", () => {
  $("#audit-prev").addEventListener("click", () => {
    if (pages.auditCursors.length > 1) pages.auditCursors.pop();
    quietly(showAudit)();
  });
  $("#audit-next").addEventListener("click", () => {
    if (pages.auditNext) pages.auditCursors.push(pages.auditNext);
    quietly(showAudit)();
  });
  // Before signing in, the page the URL names shows (empty) so the view is right at once.
  const { name } = parseHash(location.hash);
  for (const section of document.querySelectorAll("main > section[data-page]")) section.hidden = section.dataset.page !== name;
});
