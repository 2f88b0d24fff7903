// Job lists per status (GET /jobs), filtered by queue and type and paged by cursor; the search
// by job id or idempotency key; and bulk cancel, requeue or delete of the filtered set: the
// set is read page by page, confirmed, then acted on a chunk at a time through POST /bulk,
// showing "n of m" as it goes. Each chunk is one audit entry per queue, not one per job, so
// a run of BULK_MAX jobs writes at most BULK_MAX / BULK_CHUNK entries per queue.
"use strict";

const PAGE = 25;
const BULK_PAGE = 500;
const BULK_MAX = 10000;   // jobs per bulk run; a larger set takes another run
const BULK_CHUNK = 500;   // jobs per POST /bulk (its most), one after the other
// The queue figure behind each status tab's count.
const COUNTED = { queued: "ready", scheduled: "scheduled", sleeping: "sleeping", waiting: "waiting",
  processing: "processing", dead: "dead", cancelled: "cancelled" };
// The timestamp a status is about.
const WHEN = { queued: ["created_at", "Created"], scheduled: ["ready_at", "Due"], processing: ["started_at", "Started"],
  deferred: ["ready_at", "Due"], sleeping: ["sleeping_until", "Until"], waiting: ["started_at", "Started"],
  done: ["finished_at", "Finished"], dead: ["finished_at", "Died"], cancelled: ["finished_at", "Cancelled"] };
const BULK = {
  cancel: { statuses: ["queued", "scheduled", "processing", "deferred"], verb: "Cancel", past: "cancelled" },
  requeue: { statuses: ["dead"], verb: "Requeue", past: "requeued" },
  delete: { statuses: ["dead"], verb: "Delete", past: "deleted" },
};

const list = {
  status: "queued",
  queue: "",
  type: "",
  cursor: null,   // the cursor this page was read with (null: the newest page)
  back: [],       // the cursors of the pages before this one
  next: null,     // the cursor of the next page (null: this is the last)
  moved: "",      // the figures behind the list when it was last read
  bulk: null,     // the bulk run going on: { stop }
};

function listQuery(extra) {
  const params = new URLSearchParams({ status: list.status });
  if (list.queue) params.set("queue", list.queue);
  if (list.type) params.set("type", list.type);
  for (const [k, v] of Object.entries(extra || {})) if (v) params.set(k, v);
  return params.toString();
}

function jobRow(job) {
  const [field] = WHEN[list.status] || WHEN.queued;
  let detail = "—";
  if (job.progress) detail = progressBar(job.progress);
  else if (job.last_error) detail = `${job.last_error.type || "error"}: ${job.last_error.message || ""}`;
  else if (job.reason) detail = job.reason;
  let worker = "—";
  if (job.worker) {
    const left = job.lease_expires_at ? job.lease_expires_at - Date.now() / 1000 : null;
    worker = [el("code", { text: job.worker }),
      left === null ? null : el("div", { class: left < 0 ? "bad" : "muted",
        text: left < 0 ? `lease ${age(-left)} past` : `lease ${age(left)} left` })];
  }
  return el("tr", { "data-job-id": job.id },
    el("td", {}, jobLink(job.id),
      job.idempotency_key ? el("div", { class: "muted", "data-field": "idempotency_key", text: job.idempotency_key }) : null),
    el("td", { "data-field": "type", text: `${job.type} v${job.version}` }),
    el("td", { text: job.queue }),
    el("td", {}, statusBadge(job.status)),
    el("td", { text: attempts(job) }),
    el("td", { text: when(job[field]) }),
    el("td", { "data-field": "worker" }, worker),
    el("td", { "data-field": "detail" }, detail));
}

async function refreshJobs() {
  if (!pageIs("jobs")) return;  // read while its page shows
  const query = listQuery({ limit: PAGE, cursor: list.cursor });
  const page = await api("GET", `/jobs?${query}`);
  if (query !== listQuery({ limit: PAGE, cursor: list.cursor })) return;  // the filters changed meanwhile
  list.next = page.cursor;
  $("#job-when").textContent = (WHEN[list.status] || WHEN.queued)[1];
  const body = $("#job-table tbody");
  if (!page.jobs.length) {
    body.replaceChildren(el("tr", {}, el("td", { colSpan: 8, class: "muted",
      text: page.cursor ? "None of this type on this stretch: try Older."
        : `No ${list.status} jobs${list.type ? ` of type ${list.type}` : ""}${list.queue ? ` in queue ${list.queue}` : ""}.` })));
  } else {
    body.replaceChildren(...page.jobs.map(jobRow));
  }
  $("#jobs-next").disabled = !page.cursor;
  $("#jobs-newest").disabled = !list.cursor;
  $("#jobs-page").textContent = list.cursor ? `page ${list.back.length + 1}` : "";
}

const refreshJobsSoon = throttle(quietly(() => refreshJobs()), 1000);

// The queue figures came (the stream): counts on the tabs, the filter choices, and the
// newest page read again when the figures behind it moved. A later page stays as it is
// (positions shift under a live list) and says so.
function jobsFollowQueues(queues) {
  const shown = showCounts(queues);
  syncFilter($("#filter-queue"), queues.map((q) => q.name));
  syncFilter($("#filter-type"), [...new Set(queues.flatMap((q) => Object.keys(q.functions)))].sort());
  const moved = JSON.stringify(shown.map((q) => [q.name, q.ready, q.scheduled, q.processing, q.dead, q.cancelled,
    Object.values(q.functions).reduce((n, f) => n + f.enqueued + f.succeeded + f.retried + f.dead, 0)]));
  if (moved === list.moved) return;
  list.moved = moved;
  if (!list.cursor) refreshJobsSoon();
  else $("#jobs-page").textContent = `page ${list.back.length + 1} (the list has changed since: Newest reads it again)`;
}

// The counts on the tabs, of the queue filtered on (or of all): from the figures the page
// holds, so that a change of the filter shows its queue's counts at once, not the previous
// queue's until the next push. A queue the figures do not hold yet shows no count.
function showCounts(queues) {
  const shown = queues.filter((q) => !list.queue || q.name === list.queue);
  const known = shown.length > 0 || (!list.queue && queues.length > 0);
  for (const [status, field] of Object.entries(COUNTED)) {
    const node = document.querySelector(`#status-tabs [data-count="${status}"]`);
    if (node) node.textContent = known ? shown.reduce((n, q) => n + (q[field] || 0), 0) : "";
  }
  return shown;
}

function syncFilter(select, names) {
  const have = [...select.options].slice(1).map((o) => o.value);
  if (have.join(" ") === names.join(" ")) return;
  const value = select.value;
  select.replaceChildren(el("option", { value: "", text: "all" }), ...names.map((n) => el("option", { value: n, text: n })));
  select.value = names.includes(value) ? value : "";
}

// The page of a status, as its URL says: #jobs/<status>?queue=<q>&type=<t>.
function jobsHash(status, queue, type) {
  const params = new URLSearchParams();
  if (queue) params.set("queue", queue);
  if (type) params.set("type", type);
  const q = params.toString();
  return `#jobs/${encodeURIComponent(status)}${q ? "?" + q : ""}`;
}

// The router opened #jobs/...: the list that URL names.
function showJobs(status, params) {
  const queue = params.get("queue") || "";
  const type = params.get("type") || "";
  list.queue = queue;
  list.type = type;
  for (const [select, value] of [[$("#filter-queue"), queue], [$("#filter-type"), type]]) {
    if (value && ![...select.options].some((o) => o.value === value)) select.append(el("option", { value, text: value }));
    select.value = value;
  }
  list.moved = "";
  showCounts(state.queues || []);
  $("#job-table tbody").replaceChildren(el("tr", {}, el("td", { colSpan: 8, class: "muted", text: "Reading…" })));
  showStatus(status);  // read again: the list was not followed while another page showed
}

function showStatus(status, read = true) {
  list.status = status;
  for (const tab of document.querySelectorAll("#status-tabs [data-status]")) {
    tab.setAttribute("aria-selected", String(tab.dataset.status === status));
  }
  for (const [action, spec] of Object.entries(BULK)) $(`#bulk-${action}`).hidden = !spec.statuses.includes(status);
  if (read) newestPage();
}

function newestPage() {
  list.cursor = null;
  list.back = [];
  quietly(refreshJobs)();
}

// --- search ---------------------------------------------------------------------------

// An id first (GET /jobs/{id}), then an idempotency key (of the type filtered on, or of any).
async function search(text) {
  const out = $("#search-result");
  out.replaceChildren(el("span", { class: "muted", text: "searching…" }));
  let byId = null;
  try {
    byId = await api("GET", `/jobs/${encodeURIComponent(text)}`);
  } catch (err) {
    if (err.status === 401 || err.status === 403 || err.status >= 500) throw err;
  }
  let byKey = [];
  try {
    const params = new URLSearchParams({ idempotency_key: text });
    if (list.type) params.set("type", list.type);
    byKey = (await api("GET", `/jobs?${params}`)).jobs;
  } catch (err) {
    if (err.status !== 400) throw err;  // not a key this server could hold
  }
  const found = [byId, ...byKey.filter((j) => !byId || j.id !== byId.id)].filter(Boolean);
  if (!found.length) {
    out.replaceChildren(el("p", { class: "error", text: `No job has the id or idempotency key “${text}”.` }));
    return;
  }
  out.replaceChildren(el("ul", { class: "found" }, found.map((j) => el("li", { "data-job-id": j.id },
    jobLink(j.id), " ", statusBadge(j.status), ` ${j.type} `,
    el("span", { class: "muted", text: j === byId ? "by id" : `by idempotency key (${j.type})` })))));
  if (found.length === 1) lookUp(found[0].id);
}

// --- bulk actions -----------------------------------------------------------------------

function bulkText(text) {
  $("#bulk-progress").hidden = false;
  $("#bulk-text").textContent = plain(text);
}

function confirmBulk(spec, n, capped) {
  const dialog = $("#bulk-dialog");
  const where = [list.queue ? `queue ${list.queue}` : "every queue", list.type ? `type ${list.type}` : "every type"];
  $("#bulk-title").textContent = `${spec.verb} ${n}${capped ? "+" : ""} ${list.status} job${n === 1 ? "" : "s"}?`;
  $("#bulk-summary").textContent = `${where.join(", ")}; ${capped ? `the first ${n} now, run it again for the rest; ` : ""}`
    + (spec.verb === "Delete" ? "deleted jobs are gone for good." : `each job is ${spec.past} on its own, ${BULK_CHUNK} at a time.`);
  $("#bulk-yes").textContent = `${spec.verb} ${n}`;
  return new Promise((resolve) => {
    const finish = (yes) => {
      $("#bulk-form").onsubmit = null;
      $("#bulk-no").onclick = null;
      dialog.onclose = null;
      if (dialog.open) dialog.close();
      resolve(yes);
    };
    $("#bulk-form").onsubmit = (e) => { e.preventDefault(); finish(true); };
    $("#bulk-no").onclick = () => finish(false);
    dialog.onclose = () => finish(false);
    dialog.showModal();
  });
}

async function startBulk(action) {
  const spec = { ...BULK[action], action };
  if (list.bulk || !spec.statuses.includes(list.status)) return;
  const run = (list.bulk = { stop: false });
  document.body.classList.add("bulk-running");
  try {
    // The set first: what is confirmed is what is acted on, whatever moves meanwhile.
    const jobs = [];
    let cursor = null;
    do {
      bulkText(`reading the list… ${jobs.length}`);
      const page = await api("GET", `/jobs?${listQuery({ limit: BULK_PAGE, cursor })}`);
      jobs.push(...page.jobs.map((j) => ({ id: j.id, queue: j.queue })));
      cursor = page.cursor;
    } while (cursor && jobs.length < BULK_MAX && !run.stop);
    const todo = jobs.slice(0, BULK_MAX);
    if (!todo.length || run.stop) {
      bulkText(run.stop ? "stopped" : `no ${list.status} jobs to ${spec.verb.toLowerCase()}`);
      return;
    }
    if (!(await confirmBulk(spec, todo.length, Boolean(cursor) || jobs.length > BULK_MAX))) {
      $("#bulk-progress").hidden = true;
      return;
    }
    await actOnAll(spec, todo, run);
  } catch (err) {
    bulkText(`stopped: ${err.message}`);
  } finally {
    list.bulk = null;
    $("#bulk-stop").hidden = true;
    document.body.classList.remove("bulk-running");
    newestPage();
  }
}

async function actOnAll(spec, jobs, run) {
  const bar = $("#bulk-bar");
  bar.max = jobs.length;
  $("#bulk-stop").hidden = false;
  let done = 0;
  let skipped = 0;
  let failed = 0;
  const show = (final) => {
    bar.value = done + skipped + failed;
    const extra = [skipped ? `${skipped} had moved on` : "", failed ? `${failed} failed` : ""].filter(Boolean).join(", ");
    bulkText(`${final ? `${spec.past}: ` : ""}${done + skipped + failed} of ${jobs.length}${extra ? ` (${extra})` : ""}`
      + (run.stop ? " — stopped" : ""));
  };
  show(false);
  // One chunk at a time: the stop button takes effect between chunks.
  for (let next = 0; next < jobs.length && !run.stop; next += BULK_CHUNK) {
    const chunk = jobs.slice(next, next + BULK_CHUNK);
    try {
      const answer = await api("POST", "/bulk", { action: spec.action, jobs: chunk });
      for (const j of answer.jobs) {
        // gone: not there, or ended already; nothing is left to do for it.
        if (j.outcome === "gone") skipped += 1;
        else if (j.outcome === "refused") failed += 1;
        else done += 1;
      }
    } catch (err) {
      if (err.status === 401 || err.status === 403) {
        run.stop = true;
        throw err;
      }
      failed += chunk.length;
    }
    show(false);
  }
  show(true);
  toast(`${spec.verb}: ${done} ${spec.past} of ${jobs.length}`);
}

function initJobs() {
  for (const tab of document.querySelectorAll("#status-tabs [data-status]")) {
    tab.addEventListener("click", () => go(jobsHash(tab.dataset.status, list.queue, list.type)));
  }
  $("#filter-queue").addEventListener("change", (e) => go(jobsHash(list.status, e.target.value, list.type)));
  $("#filter-type").addEventListener("change", (e) => go(jobsHash(list.status, list.queue, e.target.value)));
  $("#job-filters").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("#search").value.trim();
    if (text) search(text).catch((err) => $("#search-result").replaceChildren(el("p", { class: "error", text: err.message })));
  });
  $("#jobs-newest").addEventListener("click", newestPage);
  $("#jobs-next").addEventListener("click", () => {
    if (!list.next) return;
    list.back.push(list.cursor);
    list.cursor = list.next;
    quietly(refreshJobs)();
  });
  for (const action of Object.keys(BULK)) {
    $(`#bulk-${action}`).addEventListener("click", () => startBulk(action));
  }
  $("#bulk-stop").addEventListener("click", () => { if (list.bulk) list.bulk.stop = true; });
  showStatus("queued", false);  // read once signed in (refreshAll)
}
