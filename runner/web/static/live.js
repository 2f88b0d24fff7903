// The event stream: GET /events, read with fetch (EventSource cannot send the token header,
// and a token never goes in a URL), parsed as server-sent events, reconnected when it ends.
// One stream per page; it watches the job open on the job page (?job=<id>), so switching
// jobs reconnects. The server pushes queue figures as they change and the watched job as it
// changes; the panels read their lists again when the figures say something moved.
"use strict";

const live = {
  jobs: [],          // the ids watched
  ctrl: null,        // aborts the stream in flight
  running: false,
  gen: 0,            // bumped by each start: a loop of an earlier start ends
  retryMs: 2000,     // the server's retry field
  failures: 0,
  queues: new Map(), // queue name -> its last figures (stream order)
  wake: null,        // ends the wait between two connections early
};

function setLive(text, cls) {
  const pill = $("#live");
  pill.textContent = text;
  pill.className = `pill ${cls || ""}`;
}

function liveStart() {
  if (live.running || !can("read")) return;
  live.running = true;
  live.gen += 1;
  liveLoop(live.gen);
}

function liveStop() {
  live.running = false;
  if (live.ctrl) live.ctrl.abort();
  if (live.wake) live.wake();
  setLive("offline");
}

// Watch these job ids instead: a new stream (the server reads only what pages watch).
function liveWatch(ids) {
  if (ids.join(" ") === live.jobs.join(" ")) return;
  live.jobs = ids.slice();
  if (live.ctrl) live.ctrl.abort();
  if (live.wake) live.wake();
}

function pause(ms) {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done() { clearTimeout(timer); live.wake = null; resolve(); }
    live.wake = done;
  });
}

async function liveLoop(gen) {
  while (live.running && gen === live.gen) {
    if (document.hidden || state.loginOpen) {
      await pause(1000);
      continue;
    }
    const ctrl = new AbortController();
    live.ctrl = ctrl;
    const query = live.jobs.map((id) => `job=${encodeURIComponent(id)}`).join("&");
    let ended = "";
    try {
      const headers = { Accept: "text/event-stream" };
      if (state.token) headers.Authorization = `Bearer ${state.token}`;
      const resp = await fetch(`/events${query ? "?" + query : ""}`, { headers, cache: "no-store", signal: ctrl.signal });
      if (resp.status === 401) {
        live.running = false;
        setLive("offline");
        showLogin(state.token ? "That token was refused." : "");
        return;
      }
      if (resp.status === 403) {
        live.running = false;
        setLive("offline");
        return;
      }
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      setLive("live", "ok");
      live.failures = 0;
      await readEvents(resp.body, dispatch);
      ended = "ended";
    } catch (err) {
      ended = ctrl.signal.aborted ? "aborted" : "failed";
    }
    live.ctrl = null;
    if (ended === "aborted") continue;  // a new watch list, or signed out: the loop decides
    if (ended === "failed") live.failures += 1;
    setLive("reconnecting…", "warn");
    // The server's retry after a normal end; longer after failures, up to 30 s.
    await pause(Math.min(live.retryMs * Math.pow(2, live.failures), 30000));
  }
}

// Server-sent events, as the spec parses them: fields up to a blank line make one event.
async function readEvents(body, handle) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "message";
  let data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    const lines = buffer.split(/\r\n|\r|\n/);
    buffer = lines.pop();
    for (const line of lines) {
      if (line === "") {
        if (data.length) handle(event, data.join("\n"));
        event = "message";
        data = [];
        continue;
      }
      if (line.startsWith(":")) continue;  // a comment: the server's heartbeat
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
      else if (field === "retry" && /^\d+$/.test(value)) live.retryMs = parseInt(value, 10);
    }
  }
}

function dispatch(event, text) {
  let data;
  try {
    data = parseJSON(text);
  } catch (err) {
    return;
  }
  if (event === "queues") onQueues(data);
  else if (event === "job") onJob(data);
  else if (event === "job-gone") onJobGone(data.id);
  else if (event === "health") onHealth(data);
}

function onHealth(data) {
  const pill = $("#health");
  const ok = data.redis === "ok";
  pill.textContent = ok ? "Redis reachable" : "Redis unreachable";
  pill.className = `pill ${ok ? "ok" : "bad"}`;
}

function onQueues(data) {
  const before = new Map(live.queues);
  if (data.full) live.queues.clear();
  for (const q of data.queues) live.queues.set(q.name, q);
  const queues = [...live.queues.values()];
  state.queues = queues;
  renderQueues({ queues });
  // A moved dead count, a job enqueued or ended: the panels that list them read again (a
  // figure that only ages, as the oldest wait does, reads nothing).
  const moved = (field) => data.queues.some((q) => !before.has(q.name) || field(before.get(q.name)) !== field(q));
  if (moved((q) => q.dead)) refreshDeadSoon();
  if (moved(counters)) refreshSchedulesSoon();
}

function counters(q) {
  return Object.values(q.functions).map((f) => `${f.enqueued} ${f.succeeded} ${f.retried} ${f.dead}`).join(",");
}
