// The job page (#job/<id>): its fields, progress, payload, result or error, history, the
// steps of a durable function as a timeline, its lineage (parent, children, group, the job
// that invoked it); its own log and its streamed output, both live while it runs; and its
// actions (cancel, requeue, delete, run now, signal) through the same routes as the CLI.
// Kept current by the event stream, which watches the job shown (live.js); the log and the
// stream follow their own server-sent events (GET /jobs/{id}/logs?follow=1, /stream).
"use strict";

const ENDED = new Set(["done", "dead", "cancelled"]);
// Answers that no later read will change (gone, no such scope): a follow stops on them.
const FINAL_ERRORS = new Set([400, 401, 403, 404]);
const RUN_NOW = new Set(["scheduled", "retrying", "sleeping"]);  // POST /jobs/{id}/run-now takes these

const page = { id: null, shown: "", openedAt: 0 };  // the job open, the view of it on the page (JSON)
// The job's own log: the lines as text, followed while the job runs (?follow=1), else read
// once; polled once a second if the server will not follow (too many followers).
const joblog = { id: null, timer: null, lines: [], text: "", ctrl: null, doneAt: 0 };
// What a page holds of a followed log and stream: about what the server keeps (the newest
// lines, the newest 1 MiB of output), so a job that logs or streams for minutes never
// grows the page past it.
const LOG_KEEP_LINES = 5000;
const STREAM_KEEP_CHARS = 1 << 20;
// Its ctx.stream output (GET /jobs/{id}/stream): chunks in order, shown as text.
const jobstream = { id: null, parts: [], text: "", count: 0, ctrl: null, doneAt: 0 };
const LOG_EVERY_MS = 1000;

// Opens a job's page (from a list, a search, a requeue).
function lookUp(id) {
  const hash = `#job/${encodeURIComponent(id)}`;
  if (location.hash === hash) showJob(id, true);
  else go(hash);
}

// Leaving the job page: its log and stream stop following.
function leaveJob() {
  page.id = null;
  clearTimeout(joblog.timer);
  for (const c of [joblog.ctrl, jobstream.ctrl]) if (c) c.abort();
  joblog.ctrl = jobstream.ctrl = null;
  for (const key of kept.keys()) if (key.startsWith("signal:")) kept.delete(key);  // a form per job seen
  liveWatch([]);
}

async function showJob(id, again) {
  if (page.id === id && page.shown && !again) return;  // already open (a route read again)
  leaveJob();
  page.id = id;
  page.shown = "";
  page.openedAt = performance.now();
  liveWatch([id]);
  $("#job-view").replaceChildren(el("p", { class: "muted", text: `Reading job ${id}…` }));
  Object.assign(joblog, { id, lines: [], text: "", doneAt: 0, started: false, active: false });
  Object.assign(jobstream, { id, parts: [], text: "", count: 0, cut: false, doneAt: 0, firstAt: 0, endAt: 0, started: false, active: false });
  let job;
  try {
    job = await api("GET", `/jobs/${encodeURIComponent(id)}`);
  } catch (err) {
    if (id !== page.id) return;
    if (err.status === 404 || err.status === 405) onJobGone(id);
    else $("#job-view").replaceChildren(el("p", { class: "error", text: `Could not read job ${id}: ${err.message}` }));
    return;
  }
  onJob(job);
}

function onJob(job) {
  if (job.id !== page.id) return;
  following(job);
  // The stream's first event repeats what the page just read: keep the page (and an armed
  // button) as it is unless something changed.
  const view = compact(job);
  if (view === page.shown) return;
  page.shown = view;
  renderJob(job);
}

// The log and the stream: followed while the job runs, read once when it has ended, and
// followed again when it runs again (a requeue, a retry after the follow ended).
function following(job) {
  const running = !ENDED.has(job.status);
  if (!joblog.started || (running && !joblog.active && !joblog.timer)) {
    joblog.started = true;
    joblog.lines = [];
    joblog.damaged = "";
    if (running) followLog(job.id);
    else refreshLog(job.id);
  }
  if (!jobstream.started || (running && !jobstream.active)) {
    jobstream.started = true;
    jobstream.parts = [];
    jobstream.count = 0;
    jobstream.cut = false;
    jobstream.damaged = "";
    followStream(job.id);
  }
  paintLog();  // "—" until a line comes
  paintStream();
}

function onJobGone(id) {
  if (id !== page.id) return;
  page.shown = "";
  $("#job-view").replaceChildren(el("p", { class: "error", "data-job-gone": id, text: `No job ${id}.` }));
}

// A field another part of runner may add (parent, children, group): an id, or an object
// with one, or a list of either.
function idOf(value) {
  if (typeof value === "string") return value;
  if (value && typeof value === "object" && typeof value.id === "string") return value.id;
  return null;
}

function links(value, make) {
  const items = Array.isArray(value) ? value : [value];
  const out = [];
  for (const item of items) {
    const id = idOf(item);
    out.push(id ? make(id) : el("code", { text: json(item) }), " ");
  }
  return el("span", { class: "links" }, out);
}

// A group's page (pages.js renders it).
function groupLink(id) {
  return el("a", { href: `#group/${encodeURIComponent(id)}`, "data-group-link": id, text: id });
}

// A detail object's fields as "key: value" text, its times in the one format.
function detailText(obj) {
  return Object.entries(obj).map(([k, v]) => {
    if (typeof v === "number" && /(_at|until|^at)$/.test(k)) return `${k.replace(/_at$/, "")}: ${when(v)}`;
    if (typeof v === "number" && /_ms$/.test(k) && v > 1e12) return `${k.replace(/_at_ms$|_ms$/, "")}: ${when(v / 1000)}`;
    return `${k}: ${typeof v === "string" ? v : compact(v)}`;
  }).join(", ");
}

function historyTable(entries) {
  if (!Array.isArray(entries)) return entries ? el("code", { text: json(entries) }) : "—";
  if (!entries.length) return "—";
  return el("table", { class: "history", "data-field": "history" },
    el("thead", {}, el("tr", {}, el("th", { text: "At" }), el("th", { text: "Attempt" }), el("th", { text: "Outcome" }),
      el("th", { text: "Detail" }))),
    el("tbody", {}, entries.map((h) => {
      const { at_ms: at, attempt, outcome, ...rest } = h && typeof h === "object" ? h : { entry: h };
      const detail = Object.keys(rest).length ? el("code", { text: detailText(rest) }) : "";
      return el("tr", {}, el("td", { text: typeof at === "number" ? when(at / 1000) : "—" }),
        el("td", { text: textOf(attempt) || "—" }), el("td", { text: textOf(outcome) || "—" }), el("td", {}, detail));
    })));
}

// A durable function's step log as a timeline: one row per step, sleep, wait or child
// call, in the order the handler reached them (GET /jobs/{id} "steps"), each with a bar
// placed on the span from the first start to the last end (or now, while it waits).
function stepsTable(steps) {
  if (!Array.isArray(steps)) return steps ? el("code", { text: json(steps) }) : "—";
  if (!steps.length) return "—";
  const now = Date.now() / 1000;
  const starts = steps.map((s) => s && s.started_at).filter((t) => typeof t === "number");
  const ends = steps.map((s) => s && (s.finished_at || (s.status === "waiting" || s.status === "sleeping" ? now : s.started_at)))
    .filter((t) => typeof t === "number");
  const t0 = starts.length ? Math.min(...starts) : 0;
  const t1 = Math.max(t0 + 0.001, ...ends);
  const bar = (s) => {
    const box = el("div", { class: "timeline" });
    if (typeof s.started_at !== "number") return box;
    const end = s.finished_at || (s.status === "waiting" || s.status === "sleeping" ? now : s.started_at);
    const span = el("span", { class: `status-${s.status || "ok"}` });
    span.style.left = `${((s.started_at - t0) / (t1 - t0)) * 100}%`;  // CSSOM: allowed under the CSP
    span.style.width = `${Math.max(0.5, ((end - s.started_at) / (t1 - t0)) * 100)}%`;
    box.append(span);
    return box;
  };
  return el("table", { class: "history steps", "data-field": "steps" },
    el("thead", {}, el("tr", {}, el("th", { text: "#" }), el("th", { text: "Step" }), el("th", { text: "Kind" }),
      el("th", { text: "Status" }), el("th", { text: "Started" }), el("th", { text: "Finished / until" }),
      el("th", { text: "Took" }), el("th", { class: "timeline-head", text: "Timeline" }), el("th", { text: "Detail" }))),
    el("tbody", {}, steps.map((st, i) => {
      const s = st || {};
      const detail = s.child ? jobLink(s.child)
        : s.error ? el("code", { text: `${textOf(s.error.type)}: ${textOf(s.error.message)}` })
        : s.result !== undefined ? el("code", { text: s.result })
        : s.signal ? el("code", { text: `signal ${s.signal}` }) : "";
      const end = s.finished_at ? when(s.finished_at) : s.until ? `until ${when(s.until)}` : "—";
      const took = typeof s.started_at === "number" && typeof s.finished_at === "number" ? age(s.finished_at - s.started_at) : "—";
      return el("tr", { "data-step": s.name ?? "" }, el("td", { text: String(i + 1) }), el("td", { text: s.name ?? "—" }),
        el("td", { text: s.kind ?? "—" }), el("td", { class: `status status-${s.status}`, text: s.status ?? "—" }),
        el("td", { class: "nowrap", text: s.started_at ? when(s.started_at) : "—" }), el("td", { class: "nowrap", text: end }),
        el("td", { class: "nowrap", text: took }), el("td", {}, bar(s)), el("td", {}, detail));
    })));
}

function errorBlock(err) {
  if (!err) return "—";
  return el("div", { "data-field": "error" },
    el("strong", { text: `${textOf(err.type) || "error"}: ` }), el("span", { text: textOf(err.message) }),
    err.traceback ? el("details", {}, el("summary", { text: "traceback" }), el("pre", { text: textOf(err.traceback) })) : null,
    el("details", {}, el("summary", { text: "as JSON" }), el("pre", { text: json(err) })));
}

// Two clicks: the first arms the button, so one stray click changes nothing.
function armed(button, label, action) {
  button.addEventListener("click", () => {
    if (!button.classList.contains("armed")) {
      button.classList.add("armed");
      button.textContent = `Confirm ${label.toLowerCase()}`;
      setTimeout(() => { button.classList.remove("armed"); button.textContent = label; }, 4000);
      return;
    }
    button.disabled = true;
    action().catch((err) => toast(`${label}: ${err.message}`)).finally(() => { button.disabled = false; });
  });
  return button;
}

function actions(job) {
  const out = [];
  if (!can("operate")) return el("div", { class: "actions job-actions" });
  const path = `/dead/${encodeURIComponent(job.queue)}/${encodeURIComponent(job.id)}`;
  if (!ENDED.has(job.status)) {
    out.push(armed(el("button", { type: "button", class: "danger", "data-action": "cancel", text: "Cancel" }), "Cancel",
      async () => {
        const r = await api("DELETE", `/jobs/${encodeURIComponent(job.id)}`);
        toast(r.cancel === "cancelled" ? `Cancelled ${job.id}` : `Asked ${job.id} to stop`);
        showJob(job.id);
      }));
  }
  if (RUN_NOW.has(job.status)) {
    out.push(actionButton("Run now", "operate", { class: "primary", "data-action": "run-now" }, async () => {
      try {
        await api("POST", `/jobs/${encodeURIComponent(job.id)}/run-now`);
      } catch (err) {
        if (err.status === 409) {
          const p = err.problem || {};
          throw new Error(`not run: the job is ${p.job_status || p.status_now || "no longer waiting to run"}`);
        }
        if (err.status === 404 || err.status === 405) throw new Error("not run: no such job, or this server has no run-now route");
        throw err;
      }
      toast(`Running ${job.id} now`);
    }));
  }
  if (job.status === "dead") {
    out.push(el("button", { type: "button", class: "primary", "data-action": "requeue", text: "Requeue",
      onclick: () => requeue(job, null).catch((err) => toast(`Not requeued: ${err.message}`)) }));
    out.push(el("button", { type: "button", "data-action": "edit", text: "Edit & requeue", onclick: () => openEdit(job) }));
    out.push(armed(el("button", { type: "button", class: "danger", "data-action": "delete", text: "Delete" }), "Delete",
      async () => {
        await api("DELETE", path);
        toast(`Deleted ${job.id}`);
        refreshDeadSoon();
        showJob(job.id);
      }));
  }
  return el("div", { class: "actions job-actions" }, out);
}

// A line's text is a producer's and may hold line breaks: what follows each is shown on a
// row of its own, indented under the text and marked, as `runner logs` indents it, so it
// cannot pass for a line with a time, level and source of its own. (Every break a browser
// may draw counts: a carriage return, U+2028 and U+2029, NEL.)
const LOG_BREAKS = /\r\n|[\n\r\u2028\u2029\u0085]/g;
const LOG_GO_ON = `\n${" ".repeat(38)}\u21b3 `;
// Level and source are runner's words: another writer's are cut, and shown with no break.
const LOG_WORD = /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g;

function logLine(line) {
  const t = typeof line.ts === "number" ? when(line.ts / 1000, true) : "-";
  const word = (v, n) => textOf(v).replace(LOG_WORD, "?").slice(0, 10).padEnd(n);
  return `${t}  ${word(line.level, 7)} ${word(line.src, 6)} ${textOf(line.msg).replace(LOG_BREAKS, LOG_GO_ON)}`;
}

// fetch with the token, read as server-sent events (live.js readEvents) until it ends.
async function followEvents(path, ctrl, handle) {
  const headers = { Accept: "text/event-stream" };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  const resp = await fetch(path, { headers, cache: "no-store", signal: ctrl.signal });
  if (!resp.ok) throw new ApiError(resp.status, await resp.json().catch(() => null));
  await readEvents(resp.body, handle);
}

// One paint for a burst of lines or chunks, not one per event.
function soon(fn) {
  let queued = false;
  return () => {
    if (queued) return;
    queued = true;
    setTimeout(() => { queued = false; fn(); }, 0);
  };
}

function paintPre(field, text) {
  const pre = $(`#job-view [data-field=${field}]`);
  text = plain(text);
  if (!pre || pre.textContent === text) return;
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = text;
  if (atEnd) pre.scrollTop = pre.scrollHeight;  // follow the tail unless scrolled up
}

const paintLog = soon(() => {
  // (a log key of another Redis type: what the server says of it, until lines come)
  joblog.text = joblog.lines.length ? joblog.lines.join("\n") : joblog.damaged || "—";
  paintPre("log", joblog.text);
});

async function followLog(id) {
  const ctrl = (joblog.ctrl = new AbortController());
  joblog.active = true;
  try {
    // A follow lasts a few minutes on the server (or a connection drops): follow again
    // from after the last line shown (?after= its number n), until the job has ended. A
    // line numbered at or before it starts the log afresh (it expired, and the job ran
    // again).
    let after = null;
    for (let ended = false; !ended && id === page.id;) {
      const from = after === null ? "" : `&after=${after}`;
      await followEvents(`/jobs/${encodeURIComponent(id)}/logs?follow=1${from}`, ctrl, (event, text) => {
        if (id !== page.id) return;
        if (event === "line") {
          const line = parseJSON(text);
          const n = Number.isInteger(line.n) && line.n >= 0 ? line.n : null;
          if (n !== null && after !== null && n <= after) joblog.lines = [];
          if (n !== null) after = n;
          const lines = joblog.lines;
          lines.push(logLine(line));
          if (lines.length > 2 * LOG_KEEP_LINES) lines.splice(0, lines.length - LOG_KEEP_LINES);
          paintLog();
        } else if (event === "damaged") {
          joblog.damaged = damagedText([JSON.parse(text)]);
          paintLog();
        } else if (event === "end") {
          // Only the job's own end ends the follow: one that ended on its time, or on a
          // job gone meanwhile (status null), follows again, and a gone job answers 404.
          const st = JSON.parse(text).status;
          ended = ENDED.has(st);
          paintLog();
          setTimeout(() => { joblog.doneAt = performance.now(); }, 0);
        }
      });
      if (!ended) await new Promise((r) => setTimeout(r, 1000));
    }
  } catch (err) {
    if (ctrl.signal.aborted || id !== page.id) return;
    if (err.status === 404) { paintLog(); return; }
    // The server would not follow (too many followers), or could not answer (Redis away,
    // the network): read it each second until it can.
    refreshLog(id);
  } finally {
    if (joblog.ctrl === ctrl) joblog.active = false;
  }
}

async function refreshLog(id) {
  clearTimeout(joblog.timer);
  if (id !== page.id) return;
  let got = null;
  try {
    got = await api("GET", `/jobs/${encodeURIComponent(id)}/logs`);
  } catch (err) {
    got = null;  // the log stays as last shown
    // Gone, or no read scope: nothing more to read. Else (Redis away, the network) read
    // it again later, following it once more should it answer that the job runs.
    if (id === page.id && !FINAL_ERRORS.has(err.status)) joblog.timer = setTimeout(() => refreshLog(id), LOG_EVERY_MS);
  }
  if (id !== page.id || !got) return;
  joblog.lines = got.lines.map(logLine);
  joblog.damaged = damagedText(got.damaged_keys);
  paintLog();
  if (!ENDED.has(got.status)) joblog.timer = setTimeout(() => refreshLog(id), LOG_EVERY_MS);
  else joblog.doneAt = performance.now();
}

// A chunk as text: a string as it is (a model's tokens run on), anything else as a JSON line.
function chunkText(data) {
  return typeof data === "string" ? data : `${compact(data)}\n`;
}

const paintStream = soon(() => {
  if (jobstream.parts.length > 1) jobstream.parts = [jobstream.parts.join("")];
  if (jobstream.parts.length && jobstream.parts[0].length > STREAM_KEEP_CHARS) {
    jobstream.parts = [jobstream.parts[0].slice(-STREAM_KEEP_CHARS)];
    jobstream.cut = true;
  }
  jobstream.text = jobstream.count ? (jobstream.cut ? "… (older output not shown)\n" : "") + jobstream.parts[0]
    : jobstream.damaged || "—";
  paintPre("stream", jobstream.text);
  const n = $("#job-view [data-field=stream-count]");
  if (n) n.textContent = streamCount();
});

function streamCount() {
  return jobstream.count ? `${jobstream.count.toLocaleString()} chunk${jobstream.count === 1 ? "" : "s"}` : "";
}

async function followStream(id) {
  const ctrl = (jobstream.ctrl = new AbortController());
  jobstream.active = true;
  try {
    await readStream(id, ctrl);
  } finally {
    if (jobstream.ctrl === ctrl) jobstream.active = false;
  }
}

async function readStream(id, ctrl) {
  let after = "";
  // A stream lasts a few minutes on the server: read on from the last chunk until the end.
  for (let ended = false; !ended && id === page.id;) {
    try {
      await followEvents(`/jobs/${encodeURIComponent(id)}/stream${after ? `?after=${after}` : ""}`, ctrl, (event, text) => {
        if (id !== page.id) return;
        if (event === "chunk") {
          if (!jobstream.firstAt) jobstream.firstAt = performance.now();
          const c = parseJSON(text);
          jobstream.parts.push(chunkText(c.data));
          jobstream.count += 1;
          after = c.r ? `${c.r}.${c.a}.${c.i}` : `${c.a}.${c.i}`;
          paintStream();
        } else if (event === "damaged") {
          jobstream.damaged = damagedText([JSON.parse(text)]);
          paintStream();
        } else if (event === "end") {
          jobstream.endAt = performance.now();
          const st = JSON.parse(text).status;
          ended = ENDED.has(st);  // (status null, a job gone: the next read answers 404)
          paintStream();
          setTimeout(() => { jobstream.doneAt = performance.now(); }, 0);
        }
      });
      if (!ended) await new Promise((r) => setTimeout(r, 1000));
    } catch (err) {
      if (ctrl.signal.aborted || id !== page.id) return;
      console.warn(`the stream of ${id}: ${err.message}`);
      if (FINAL_ERRORS.has(err.status) || err.status === 429) return;  // gone or refused: what came stays shown
      await new Promise((r) => setTimeout(r, 1000));  // Redis away, the network: read on from where it was
    }
  }
}

// The signal form of a job waiting in ctx.wait_for_signal(name): its name and a JSON body.
function signalForm(job) {
  const w = job.waiting_for || {};
  return keep(`signal:${job.id}:${w.signal || ""}:${can("signal")}`, () => {
    if (!can("signal")) return el("span");
    const name = el("input", { id: "signal-name", value: w.signal || "", size: 24, required: true, spellcheck: false });
    const body = el("textarea", { id: "signal-body", rows: 4, spellcheck: false, value: "{}" });
    const out = el("p", { id: "signal-result", role: "status" });
    const form = el("form", { id: "signal-form", class: "inline-form" },
      el("label", {}, "Signal ", name), el("label", {}, "Body (JSON)", body),
      el("button", { type: "submit", class: "primary", text: "Send signal" }), out);
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      // The body goes as the box holds it (Verbatim): parsed only to check it is JSON.
      try {
        JSON.parse(body.value);
      } catch (err) {
        out.className = "error";
        out.textContent = plain(`Not valid JSON: ${err.message}`);
        return;
      }
      try {
        const r = await api("POST", `/jobs/${encodeURIComponent(job.id)}/signals/${encodeURIComponent(name.value.trim())}`,
          new Verbatim(body.value));
        out.className = "muted";
        out.textContent = r.delivery === "resumed" ? "Delivered: the job resumes." : "Kept: the job reads it when it waits for it.";
      } catch (err) {
        out.className = "error";
        out.textContent = plain(`Not sent: ${err.message}`);
      }
    });
    return form;
  });
}

function renderJob(job) {
  // Facts on the left; lineage and data on the right; then the timelines, log and stream.
  const facts = [
    ["status", statusBadge(job.status)],
    ["type", el("a", { href: `#function/${encodeURIComponent(job.type)}`, text: `${job.type} v${job.version}` })],
    ["queue", el("a", { href: `#queue/${encodeURIComponent(job.queue)}`, text: job.queue })],
    ["attempt", attempts(job)],
    ["created", when(job.created_at)], ["ready", when(job.ready_at)], ["started", when(job.started_at)],
    ["finished", when(job.finished_at)],
  ];
  if (job.worker) facts.push(["worker", el("code", { "data-field": "worker", text: job.worker })]);
  if (job.lease_expires_at) facts.push(["lease until", when(job.lease_expires_at)]);
  if (job.progress) facts.push(["progress", progressBar(job.progress)]);
  facts.push(["idempotency key", el("span", { "data-field": "idempotency_key", text: job.idempotency_key || "—" })],
    ["resource key", job.resource_key || "—"], ["reason", job.reason || "—"]);
  if (job.sleeping_until) facts.push(["sleeping until", when(job.sleeping_until)]);
  const data = [];
  if (job.duplicate_of) data.push(["duplicate of", jobLink(job.duplicate_of)]);
  if (job.parent) data.push(["parent", links(job.parent, jobLink)]);
  if (job.children && (!Array.isArray(job.children) || job.children.length)) data.push(["children", links(job.children, jobLink)]);
  if (job.group) data.push(["group", links(job.group, groupLink)]);
  if (job.invoked_by) data.push(["invoked by", links(job.invoked_by, jobLink)]);
  if (job.schedule) data.push(["schedule", `${job.schedule}${job.tick ? " at " + stamp(job.tick) : ""}`]);
  data.push(["payload", job.payload === null && job.status === "done"
    ? el("span", { class: "muted", "data-field": "payload", text: "— (a done job keeps its result, not its payload)" })
    : el("pre", { "data-field": "payload", text: json(job.payload) })]);
  if (job.status === "done" || job.result !== null) data.push(["result", el("pre", { "data-field": "result", text: json(job.result) })]);
  if (job.waiting_for) {
    const what = job.waiting_for.event
      ? `event ${job.waiting_for.event} ${compact(job.waiting_for.match || {})}`
      : `signal ${textOf(job.waiting_for.signal)}`;
    data.push(["waiting for", what +
      (job.waiting_for.timeout_at ? `, until ${when(job.waiting_for.timeout_at)}` : "")]);
  }
  if (job.status === "waiting" && job.waiting_for && job.waiting_for.signal) data.push(["signal", signalForm(job)]);
  data.push(["last error", errorBlock(job.last_error)]);
  const below = [];
  if (job.steps) below.push(["steps", stepsTable(job.steps)]);
  below.push(["history", historyTable(job.history)]);
  below.push(["log", el("pre", { class: "joblog loglines", "data-field": "log", text: joblog.id === job.id ? joblog.text || "…" : "…" })]);
  below.push([el("span", {}, "stream", el("div", { class: "muted", "data-field": "stream-count", text: streamCount() })),
    el("pre", { class: "joblog", "data-field": "stream", text: jobstream.id === job.id ? jobstream.text || "…" : "…" })]);
  const table = (rows, cls) => el("table", { class: `job ${cls}`, "data-job-id": job.id },
    rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))));
  $("#job-view").replaceChildren(
    el("div", { class: "job-head" }, el("h3", {}, el("code", { text: job.id })), actions(job)),
    el("div", { class: "job-grid" }, table(facts, "facts"), table(data, "data")),
    table(below, "below"));
}
