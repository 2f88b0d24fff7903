// The job page (#job/<id>): its fields, progress, payload, result or error, history, and links
// to its parent, children and group when the job has them; its own log; and its actions
// (cancel, requeue, delete) through the same routes as the CLI. Kept current by the event
// stream, which watches the job shown (live.js); only the log of a job still running is
// read again, once a second.
"use strict";

const ENDED = new Set(["done", "dead", "cancelled"]);

const page = { id: null, shown: "" };  // the job open, and the view of it on the page (JSON)
// The job's own log (GET /jobs/{id}/logs): read when the page opens and, while the job has
// not ended, once a second (its lines land with the worker's lease renewals), as text only.
const joblog = { id: null, timer: null, text: "" };
const LOG_EVERY_MS = 1000;

// Opens a job's page (from a list, a search, a requeue).
function lookUp(id) {
  const hash = `#job/${encodeURIComponent(id)}`;
  if (location.hash === hash) showJob(id);
  else location.hash = hash;
}

async function showJob(id) {
  page.id = id;
  page.shown = "";
  liveWatch([id]);
  clearTimeout(joblog.timer);
  joblog.id = id;
  joblog.text = "";
  refreshLog(id);
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
  // The stream's first event repeats what the page just read: keep the page (and an armed
  // button) as it is unless something changed.
  const view = JSON.stringify(job);
  if (view === page.shown) return;
  page.shown = view;
  renderJob(job);
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

function groupLink(id) {
  return el("a", { href: `#group/${encodeURIComponent(id)}`, "data-group-link": id, text: id,
    onclick: (e) => { e.preventDefault(); showGroup(id); } });
}

// GET /groups/{id} as it answers, where the server has it.
async function showGroup(id) {
  const view = $("#job-view");
  try {
    const group = await api("GET", `/groups/${encodeURIComponent(id)}`);
    view.replaceChildren(el("h3", {}, "Group ", el("code", { text: id })), el("pre", { text: json(group) }));
  } catch (err) {
    view.append(el("p", { class: "error", text: `Group ${id}: ${err.message}` }));
  }
}

function historyTable(entries) {
  if (!entries || !entries.length) return "—";
  return el("table", { class: "history", "data-field": "history" },
    el("thead", {}, el("tr", {}, el("th", { text: "At" }), el("th", { text: "Attempt" }), el("th", { text: "Outcome" }),
      el("th", { text: "Detail" }))),
    el("tbody", {}, entries.map((h) => {
      const { at_ms: at, attempt, outcome, ...rest } = h || {};
      const detail = Object.keys(rest).length ? el("code", { text: JSON.stringify(rest) }) : "";
      return el("tr", {}, el("td", { text: at ? when(at / 1000) : "—" }), el("td", { text: attempt ?? "—" }),
        el("td", { text: outcome ?? "—" }), el("td", {}, detail));
    })));
}

// A durable function's step log as a timeline: one row per step, sleep, wait or child
// call, in the order the handler reached them (GET /jobs/{id} "steps").
function stepsTable(steps) {
  if (!steps || !steps.length) return "—";
  return el("table", { class: "history steps", "data-field": "steps" },
    el("thead", {}, el("tr", {}, el("th", { text: "#" }), el("th", { text: "Step" }), el("th", { text: "Kind" }),
      el("th", { text: "Status" }), el("th", { text: "Started" }), el("th", { text: "Finished / until" }),
      el("th", { text: "Detail" }))),
    el("tbody", {}, steps.map((st, i) => {
      const s = st || {};
      const detail = s.child ? jobLink(s.child)
        : s.error ? el("code", { text: `${s.error.type}: ${s.error.message}` })
        : s.result !== undefined ? el("code", { text: s.result })
        : s.signal ? el("code", { text: `signal ${s.signal}` }) : "";
      const end = s.finished_at ? when(s.finished_at) : s.until ? `until ${when(s.until)}` : "—";
      return el("tr", {}, el("td", { text: String(i + 1) }), el("td", { text: s.name ?? "—" }),
        el("td", { text: s.kind ?? "—" }), el("td", { text: s.status ?? "—" }),
        el("td", { text: s.started_at ? when(s.started_at) : "—" }), el("td", { text: end }), el("td", {}, detail));
    })));
}

function errorBlock(err) {
  if (!err) return "—";
  return el("div", { "data-field": "error" },
    el("strong", { text: `${err.type || "error"}: ` }), el("span", { text: err.message || "" }),
    err.traceback ? el("details", {}, el("summary", { text: "traceback" }), el("pre", { text: err.traceback })) : null,
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
  const path = `/dead/${encodeURIComponent(job.queue)}/${encodeURIComponent(job.id)}`;
  if (!ENDED.has(job.status)) {
    out.push(armed(el("button", { type: "button", class: "danger", "data-action": "cancel", text: "Cancel" }), "Cancel",
      async () => {
        const r = await api("DELETE", `/jobs/${encodeURIComponent(job.id)}`);
        toast(r.cancel === "cancelled" ? `Cancelled ${job.id}` : `Asked ${job.id} to stop`);
        showJob(job.id);
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

function logLine(line) {
  const t = typeof line.ts === "number" ? new Date(line.ts).toISOString().replace("T", " ").slice(0, 23) : "-";
  return `${t}  ${String(line.level || "").padEnd(7)} ${String(line.src || "").padEnd(6)} ${line.msg}`;
}

async function refreshLog(id) {
  clearTimeout(joblog.timer);
  if (id !== page.id) return;
  let got = null;
  try {
    got = await api("GET", `/jobs/${encodeURIComponent(id)}/logs`);
  } catch (err) {
    got = null;  // gone, or no read scope: the log stays as last shown
  }
  if (id !== page.id || !got) return;
  joblog.text = got.lines.length ? got.lines.map(logLine).join("\n") : "—";
  const pre = $("#job-view [data-field=log]");
  if (pre && pre.textContent !== joblog.text) {
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = joblog.text;
    if (atEnd) pre.scrollTop = pre.scrollHeight;  // follow the tail unless scrolled up
  }
  if (!ENDED.has(got.status)) joblog.timer = setTimeout(() => refreshLog(id), LOG_EVERY_MS);
}

function renderJob(job) {
  const rows = [
    ["status", statusBadge(job.status)],
    ["type", `${job.type} v${job.version}`], ["queue", job.queue],
    ["attempt", attempts(job)],
    ["created", when(job.created_at)], ["ready", when(job.ready_at)], ["started", when(job.started_at)],
    ["finished", when(job.finished_at)],
  ];
  if (job.worker) rows.push(["worker", el("code", { "data-field": "worker", text: job.worker })]);
  if (job.lease_expires_at) rows.push(["lease until", when(job.lease_expires_at)]);
  if (job.progress) rows.push(["progress", progressBar(job.progress)]);
  rows.push(["idempotency key", el("span", { "data-field": "idempotency_key", text: job.idempotency_key || "—" })],
    ["resource key", job.resource_key || "—"], ["reason", job.reason || "—"]);
  if (job.duplicate_of) rows.push(["duplicate of", jobLink(job.duplicate_of)]);
  if (job.parent) rows.push(["parent", links(job.parent, jobLink)]);
  if (job.children && (!Array.isArray(job.children) || job.children.length)) rows.push(["children", links(job.children, jobLink)]);
  if (job.group) rows.push(["group", links(job.group, groupLink)]);
  if (job.schedule) rows.push(["schedule", `${job.schedule}${job.tick ? " at " + job.tick : ""}`]);
  rows.push(["payload", el("pre", { "data-field": "payload", text: json(job.payload) })]);
  if (job.status === "done" || job.result !== null) rows.push(["result", el("pre", { "data-field": "result", text: json(job.result) })]);
  if (job.sleeping_until) rows.push(["sleeping until", when(job.sleeping_until)]);
  if (job.waiting_for) {
    const what = job.waiting_for.event
      ? `event ${job.waiting_for.event} ${JSON.stringify(job.waiting_for.match || {})}`
      : `signal ${job.waiting_for.signal}`;
    rows.push(["waiting for", what +
      (job.waiting_for.timeout_at ? `, until ${when(job.waiting_for.timeout_at)}` : "")]);
  }
  if (job.invoked_by) rows.push(["invoked by", jobLink(job.invoked_by.id)]);
  rows.push(["last error", errorBlock(job.last_error)], ["history", historyTable(job.history)]);
  if (job.steps) rows.push(["steps", stepsTable(job.steps)]);
  rows.push(["log", el("pre", { class: "joblog", "data-field": "log", text: joblog.id === job.id ? joblog.text || "…" : "…" })]);
  $("#job-view").replaceChildren(
    el("div", { class: "job-head" }, el("h3", {}, el("code", { text: job.id })), actions(job)),
    el("table", { class: "job", "data-job-id": job.id },
      rows.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", {}, v)))));
}
