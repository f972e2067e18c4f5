// mlx-cluster-serve dashboard: polls /dashboard/state once a second; the chat box streams
// through /v1/chat/completions. Plain JS, no build step, no dependencies.
"use strict";

const POLL_MS = 1000;
const KEY_STORE = "mlx-cluster-serve.api-key";
const $ = (id) => document.getElementById(id);

let servedModel = "default";
let chatHistory = [];

// ---- helpers -------------------------------------------------------------------------------

function authHeaders(extra = {}) {
  const key = localStorage.getItem(KEY_STORE);
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

function bytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(n >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

function seconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  return `${s.toFixed(s < 10 ? 2 : 1)} s`;
}

function duration(s) {
  s = Math.floor(s || 0);
  if (s >= 3600) return `${Math.floor(s / 3600)}h${String(Math.floor(s / 60) % 60).padStart(2, "0")}m`;
  return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
}

function rate(n) {
  if (!n) return "–";
  return n >= 1e9 ? `${(n / 1e9).toFixed(2)} GB/s` : `${(n / 1e6).toFixed(1)} MB/s`;
}

function micro(s) {
  return s >= 0.001 ? `${(s * 1000).toFixed(2)} ms` : `${Math.round(s * 1e6)} µs`;
}

function clock(t) {
  return new Date(t * 1000).toLocaleTimeString([], { hour12: false });
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

// ---- rendering -----------------------------------------------------------------------------

function renderStatus(state) {
  const h = state.health;
  const ok = h.http_status === 200;
  const pill = $("status");
  pill.className = "pill " + (ok ? "pill-ok" : "pill-bad");
  pill.textContent = ok ? "healthy" : `engine ${h.engine}`;
  pill.title = JSON.stringify({ status: h.status, api: h.api, engine: h.engine });
  $("model").textContent = state.model;
  const facts = [];
  if (h.backend) facts.push(`${h.ranks} rank${h.ranks === 1 ? "" : "s"} · ${h.backend}`);
  if (h.parallel === "pipeline" && h.pipeline_layers && h.pipeline_layers.length) {
    facts.push(`pipeline parallel: layers ${h.pipeline_layers.join(" + ")}`);
  } else if (h.parallel === "tensor") facts.push("tensor parallel");
  if (h.context_length) facts.push(`context ${h.context_length}`);
  // how the KV cache stores keys and values: the model's float type or KV_BITS (absent from an older engine)
  if (h.kv_memory && h.kv_memory.precision) facts.push(`KV ${h.kv_memory.precision}`);
  if (h.uptime !== undefined) facts.push(`engine up ${duration(h.uptime)}`);
  facts.push(`API up ${duration(h.api_uptime)}`);
  $("facts").textContent = facts.join("   ·   ");
}

function renderSpark(series) {
  const svg = $("spark");
  const max = Math.max(1, ...series);
  const w = 300, h = 48, n = series.length;
  const pts = series.map((v, i) => `${(i / Math.max(1, n - 1)) * w},${h - 2 - (v / max) * (h - 4)}`);
  svg.innerHTML = "";
  const ns = "http://www.w3.org/2000/svg";
  const area = document.createElementNS(ns, "polygon");
  area.setAttribute("points", `0,${h} ${pts.join(" ")} ${w},${h}`);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", pts.join(" "));
  svg.append(area, line);
}

function renderCards(state) {
  const h = state.health;
  $("tps").textContent = state.tokens_per_second.toFixed(1);
  renderSpark(state.tokens_series);
  const peak = Math.max(0, ...state.tokens_series);
  $("tps-sub").textContent = `last minute, peak ${peak}/s · ${state.generated_total} generated since the API started`;
  $("ttft").textContent = seconds(state.ttft.last);
  $("ttft-sub").textContent = state.ttft.mean === null ? "no request yet" : `mean ${seconds(state.ttft.mean)} (recent)`;
  const known = h.queued !== undefined;
  $("queue").textContent = known ? h.queued : "–";
  $("queue-sub").textContent = known ? `of ${h.max_queue} waiting slots` : "";
  $("active").textContent = known ? h.active : "–";
  $("active-sub").textContent = known ? `of ${h.max_batch} batch slots` : "";
  $("step-age").textContent = known ? seconds(h.last_step_age) + " ago" : "–";
  $("step-sub").textContent = known ? `step ${h.step} · stall after ${h.stall_deadline} s` : "";
  renderSpeculation(h.speculative);
  renderDisk(h.prompt_cache_disk);
}

function renderDisk(d) {
  // the prefix cache's disk tier on rank 0: entries, bytes of its cap, the restores it served and at what rate
  // (bytes read back over the seconds spent reading and rebuilding them), the files written and evicted
  if (!d || !d.cap_bytes) {
    $("disk").textContent = "off";
    $("disk-sub").textContent = d ? "PROMPT_CACHE_DISK_BYTES=0, the prefix cache off, or still opening" : "";
    return;
  }
  $("disk").textContent = `${d.entries}`;
  $("disk-sub").textContent = `entries · ${bytes(d.bytes)} of ${bytes(d.cap_bytes)} · ${d.hits} hits · ` +
    `${d.restores} restores, ${d.restore_failures} failed · restore rate ` +
    `${rate(d.seconds_restoring ? d.bytes_restored / d.seconds_restoring : 0)} · ` +
    `${d.writes} writes, ${d.evictions} evictions`;
}

function renderSpeculation(s) {
  // tokens a sequence gains per target forward pass that verified drafts, and the share of drafts accepted
  if (!s || s.mode === "off") {
    $("spec").textContent = "off";
    $("spec-sub").textContent = s ? "SPECULATIVE=off, or the model cannot verify drafts" : "";
    return;
  }
  $("spec").textContent = s.forward_passes ? s.tokens_per_forward.toFixed(2) : "–";
  $("spec-sub").textContent = s.proposed_tokens
    ? `${s.mode} · ${(100 * s.acceptance).toFixed(0)} % of ${s.proposed_tokens} drafts accepted`
    : `${s.mode} · no drafts proposed yet`;
}

function memoryBar(r) {
  const total = r.host_memory_total || 1;
  const used = Math.max(0, total - r.host_memory_available);
  const other = Math.max(0, used - r.active_memory - r.cache_memory);
  const pct = (v) => `${Math.min(100, (v / total) * 100)}%`;
  const bar = el("div", { class: "bar", title: `${bytes(used)} of ${bytes(total)} used` });
  for (const [cls, v] of [["active", r.active_memory], ["cache", r.cache_memory], ["other", other]]) {
    // a visible sliver even when MLX holds a few MB of a large host
    const span = el("span", { class: cls });
    span.style.width = v > 0 ? `max(2px, ${pct(v)})` : "0";
    bar.append(span);
  }
  return bar;
}

function renderTopology(state) {
  const h = state.health;
  const box = $("topology");
  box.innerHTML = "";
  const api = el("div", { class: "node api" },
    el("div", { class: "title" }, "API gateway"),
    el("div", { class: "meta" }, `up ${duration(h.api_uptime)}`),
    el("div", { class: "meta" }, `${state.requests_total} requests`));
  box.append(api);
  const ranks = h.rank_states || [];
  box.append(el("div", { class: "link" }, "socket", el("div", { class: "wire" }),
    h.http_status === 200 ? "ok" : (h.engine || "").split(":")[0]));
  if (!ranks.length) {
    box.append(el("div", { class: "node stale" }, el("div", { class: "title" }, "engine"),
      el("div", { class: "meta" }, h.engine || "no report yet")));
    return;
  }
  const links = h.links || [];
  ranks.forEach((r, i) => {
    if (i > 0) {
      const l = links.find((x) => x.a === i - 1 && x.b === i);
      box.append(el("div", { class: "link" }, h.backend, el("div", { class: "wire" }),
        l ? `${micro(l.latency_seconds)} · ${rate(l.bandwidth_bytes_per_second)}` : "all_sum"));
    }
    const silent = (r.unanswered || 0) >= 1;
    const stale = r.report_age >= h.stall_deadline || silent;
    box.append(el("div", { class: "node" + (stale ? " stale" : "") },
      el("div", { class: "title" }, `rank ${r.rank}${r.rank === 0 ? " · leader" : ""}`),
      el("div", { class: "meta" }, `${r.host || "?"} · pid ${r.pid} · step ${r.step}`),
      memoryBar(r),
      el("div", { class: "meta" },
        `MLX ${bytes(r.active_memory)} (+${bytes(r.cache_memory)} cache, peak ${bytes(r.peak_memory)})`),
      // the helper models pinned on this rank (HELPER_RANK), inside its MLX memory
      r.helper_bytes ? el("div", { class: "meta helpers" }, `helpers ${bytes(r.helper_bytes)} of it`) : "",
      el("div", { class: "meta" },
        `host ${bytes(r.host_memory_total - r.host_memory_available)} / ${bytes(r.host_memory_total)} · ` +
        `report ${seconds(r.report_age)} ago`),
      silent ? el("div", { class: "meta s5 silent" }, `NOT ANSWERING for ${seconds(r.unanswered)}`) : ""));
  });
}

function renderLinks(state) {
  const links = state.health.links || [];
  const body = $("links").querySelector("tbody");
  body.innerHTML = "";
  for (const l of links) {
    body.append(el("tr", { "data-pair": `${l.a}-${l.b}` },
      el("td", {}, `${l.a} – ${l.b}`),
      el("td", {}, `${l.host_a || "?"} – ${l.host_b || "?"}`),
      el("td", { class: "num latency" }, micro(l.latency_seconds)),
      el("td", { class: "num bandwidth" }, rate(l.bandwidth_bytes_per_second)),
      el("td", { class: "num" }, `${seconds(l.age)} ago`),
      el("td", { class: "num" }, `${bytes(l.probe_bytes)} in ${seconds(l.probe_seconds)}`)));
  }
  $("links-empty").hidden = links.length > 0;
  $("links-empty").textContent = (state.health.ranks || 1) > 1 ? "No link probed yet (the engine probes when idle)."
    : "One rank: no links.";
}

function renderTransfer(t) {
  const box = $("transfer");
  box.hidden = !t;
  if (!t) return;
  box.innerHTML = "";
  const pct = t.bytes_total ? Math.min(100, (100 * t.bytes_done) / t.bytes_total) : 0;
  let what = `${t.phase} ${t.model}: ${bytes(t.bytes_done)} of ${bytes(t.bytes_total)}`;
  if (t.phase !== "done" && t.phase !== "failed") what += ` · ${rate(t.rate)}${t.file ? " · " + t.file : ""}`;
  if (t.hosts.length) what += ` · ${t.hosts.join(", ")}`;
  if (t.error) what += ` · ${t.error}`;
  if (t.stale) what += " · not updated for a while: the transfer stopped (run it again to resume)";
  const bar = el("div", { class: "bar" });
  const done = el("span", { class: "done" });
  done.style.width = `${pct}%`;
  bar.append(done);
  box.append(el("div", { class: t.phase === "failed" || t.stale ? "s5" : "" }, what), bar);
  box.dataset.phase = t.phase;
}

function renderModels(state) {
  const m = state.models;
  const served = state.model;
  $("models-served").textContent = `served: ${served}`;
  renderTransfer(state.transfer);
  const body = $("models").querySelector("tbody");
  body.innerHTML = "";
  for (const h of m.hosts) {
    for (const model of h.models) {
      const complete = model.complete === true;
      const isServed = model.repo === (m.served || served);
      const cls = (complete ? "" : "incomplete") + (isServed ? " served" : "");
      body.append(el("tr", { class: cls.trim(), "data-host": h.host, "data-repo": model.repo },
        el("td", {}, `${h.host}${h.ranks.length ? " (rank " + h.ranks.join(", ") + ")" : ""}`),
        el("td", {}, model.repo + (isServed ? " · served" : "")),
        el("td", { class: "num" }, bytes(model.size)),
        el("td", {}, complete ? "complete" : `incomplete${model.missing ? ` (${model.missing} files missing)` : ""}`)));
    }
  }
  const note = $("models-note");
  if (!m.available) note.textContent = m.note;
  else if (!body.children.length) note.textContent = "No model in any host's cache.";
  else note.textContent = m.updated ? `as of ${clock(m.updated)} (./launch.sh models refreshes it)` : "";
}

function statusCell(status) {
  return el("td", { class: `num s${String(status)[0]}` }, status);
}

function renderRequests(state) {
  const body = $("requests").querySelector("tbody");
  body.innerHTML = "";
  for (const r of state.recent) {
    body.append(el("tr", { "data-id": r.id },
      el("td", {}, clock(r.time)),
      el("td", { class: "id", title: r.id }, r.id === "-" ? "–" : r.id.slice(0, 18)),
      el("td", {}, r.endpoint),
      el("td", { class: "num" }, r.prompt_tokens ?? "–"),
      el("td", { class: "num" }, r.completion_tokens ?? "–"),
      el("td", { class: "num" }, seconds(r.ttft)),
      el("td", { class: "num" }, seconds(r.duration)),
      statusCell(r.status)));
  }
  $("requests-empty").hidden = state.recent.length > 0;
  const list = $("errors");
  list.innerHTML = "";
  for (const e of state.errors) {
    list.append(el("li", {}, `${clock(e.time)}  `, el("b", { class: `s${String(e.status)[0]}` }, e.status),
      `  ${e.endpoint}  ${e.outcome || ""}  `, el("span", { class: "muted" }, e.id)));
  }
  $("errors-empty").hidden = state.errors.length > 0;
}

// ---- polling -------------------------------------------------------------------------------

async function poll() {
  try {
    const res = await fetch("/dashboard/state", { headers: authHeaders(), cache: "no-store" });
    if (res.status === 401 || res.status === 403) {
      // 403: a tenant's key; the page needs an operator's (the message says which setting)
      const body = await res.json().catch(() => ({}));
      $("key-why").textContent = (body.error && body.error.message) || "This server needs an API key.";
      $("key-bar").hidden = false;
      return;
    }
    const state = await res.json();
    servedModel = state.served_model || servedModel;
    renderStatus(state);
    renderCards(state);
    renderTopology(state);
    renderLinks(state);
    renderModels(state);
    renderRequests(state);
  } catch (err) {
    const pill = $("status");
    pill.className = "pill pill-bad";
    pill.textContent = "API unreachable";
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

// ---- chat ----------------------------------------------------------------------------------

function chatBubble(cls, text) {
  const node = el("div", { class: `msg ${cls}` }, text);
  $("chat-log").append(node);
  $("chat-log").scrollTop = $("chat-log").scrollHeight;
  return node;
}

async function sendChat(text) {
  chatHistory.push({ role: "user", content: text });
  chatBubble("user", text);
  const out = chatBubble("assistant", "");
  out.dataset.state = "streaming";
  out.dataset.chunks = "0";
  let reply = "";
  try {
    const res = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json" }),
      body: JSON.stringify({ model: servedModel, messages: chatHistory, stream: true, max_tokens: 64 }),
    });
    if (!res.ok) {
      const body = await res.json().catch(() => ({}));
      if (res.status === 401) $("key-bar").hidden = false;
      throw new Error(body.error ? body.error.message : `HTTP ${res.status}`);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of frame.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          if (chunk.id) out.dataset.requestId = chunk.id;
          const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
          if (delta && delta.content) {
            reply += delta.content;
            out.textContent = reply;
            out.dataset.chunks = String(Number(out.dataset.chunks) + 1);
            $("chat-log").scrollTop = $("chat-log").scrollHeight;
          }
        }
      }
    }
    chatHistory.push({ role: "assistant", content: reply });
    out.dataset.state = "done";
  } catch (err) {
    chatHistory.pop();
    out.className = "msg error";
    out.textContent = `error: ${err.message}`;
    out.dataset.state = "error";
  }
}

$("chat-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const input = $("chat-input");
  const text = input.value.trim();
  if (!text) return;
  input.value = "";
  $("chat-send").disabled = true;
  try { await sendChat(text); } finally { $("chat-send").disabled = false; input.focus(); }
});

$("key-save").addEventListener("click", () => {
  const key = $("key-input").value.trim();
  if (key) localStorage.setItem(KEY_STORE, key); else localStorage.removeItem(KEY_STORE);
  $("key-bar").hidden = true;
});

poll();
