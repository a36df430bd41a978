// dpcluster dashboard: polls /api/status every second and /api/history
// when the step moves, and draws the charts on <canvas>. No libraries.
// Every string from the server is set with textContent, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
let lastHistoryStep = -1;
let lastHistoryAt = 0;
let history = { steps: [], evals: [] };
let status = null;

function set(id, text) { $(id).textContent = text; }

function fmt(x, digits) {
  if (x === null || x === undefined || !Number.isFinite(x)) return "–";
  return Number(x).toFixed(digits);
}

function ago(ts, now) {
  const t = Date.parse(ts);
  if (!t || t < Date.UTC(2000, 0, 1)) return "–";
  const s = Math.max(0, (now - t) / 1000);
  if (s < 60) return s.toFixed(1) + " s ago";
  if (s < 3600) return Math.floor(s / 60) + " min ago";
  return Math.floor(s / 3600) + " h ago";
}

function renderStatus(st) {
  const now = Date.parse(st.updated) || Date.now();
  document.title = "dpcluster · " + st.run;
  set("run", st.run);
  const state = $("state");
  state.textContent = st.stopped ? "stopped: " + st.stopped : st.role === "leader" ? "running" : st.role;
  state.className = "badge " + (st.stopped ? "done" : st.role === "leader" ? "running" : "");
  const priv = $("private");
  priv.textContent = st.private ? "differentially private" : "NOT PRIVATE (seeded noise)";
  priv.className = "badge " + (st.private ? "" : "warn");
  set("view", "view of replica " + st.replica + " (" + st.role + ", term " + st.term + ")" +
    (st.leader && st.leader !== st.replica ? " · leader " + st.leader : ""));

  set("step", st.step);
  set("max-steps", st.max_steps > 0 ? st.max_steps : "∞");
  $("step-bar").style.width = (st.max_steps > 0 ? Math.min(100, 100 * st.step / st.max_steps) : 0) + "%";
  set("epsilon", fmt(st.epsilon, 3));
  set("target-epsilon", fmt(st.target_epsilon, 3));
  const used = st.target_epsilon > 0 && Number.isFinite(st.epsilon) ? st.epsilon / st.target_epsilon : 1;
  $("budget-bar").style.width = Math.min(100, 100 * used) + "%";
  $("budget-bar").parentElement.className = "bar budget" + (used >= 0.9 ? " high" : "");
  set("delta", Number.isFinite(st.delta) ? st.delta.toExponential(1) : "–");
  set("accountant", st.accountant);
  set("noise", st.noise_mode);
  set("blocked", st.blocked ? "blocked: " + st.blocked : "");

  const ev = st.eval;
  const label = ev ? ev.label : "test";
  set("eval-title", ev && !ev.private ? "Evaluation (NON-PRIVATE holdout)" : "Evaluation (" + label + ")");
  set("accuracy", ev ? fmt(100 * ev.accuracy, 2) + " %" : "–");
  set("loss", ev ? fmt(ev.loss, 4) : "–");
  set("eval-step", ev ? ev.step : "–");
  set("eval-n", ev ? ev.n : "–");
  set("acc-caption", label + " accuracy");
  set("loss-caption", label + " loss");

  fillTable("nodes", st.nodes || [], (n) => [
    n.id, n.shard_count > 0 ? n.shard_index + " of " + n.shard_count : "–", n.shard_size,
    ago(n.last_seen, now), n.answered, n.skipped,
    n.standing === "good" || !n.standing ? n.standing || "–"
      : n.standing + (n.standing_detail ? " (" + n.standing_detail + ")" : "") + " since step " + n.out_since_step,
  ], (n) => now - Date.parse(n.last_seen) > 5000);
  set("node-count", "(" + (st.nodes || []).length + ")");
  fillTable("replicas", st.replicas || [], (r) => [
    r.id + (r.self ? " (this one)" : ""), r.role, r.term, r.step, r.leader || "–", r.self ? "now" : ago(r.reported, now),
  ], (r) => !r.self && now - Date.parse(r.reported) > 5000);
}

function fillTable(id, rows, cells, stale) {
  const body = $(id).tBodies[0];
  const out = document.createDocumentFragment();
  for (const row of rows) {
    const tr = document.createElement("tr");
    tr.dataset.id = row.id;
    if (stale(row)) tr.className = "stale";
    for (const c of cells(row)) {
      const td = document.createElement("td");
      td.textContent = String(c);
      tr.appendChild(td);
    }
    out.appendChild(tr);
  }
  body.replaceChildren(out);
}

function renderHistory(h, st) {
  const steps = h.steps || [], evals = h.evals || [];
  const led = steps.filter((p) => p.participants > 0);
  const last = led.length ? led[led.length - 1] : null;
  set("latency", last ? fmt(last.round_seconds, 3) + " s" : "–");
  set("participants", last ? last.participants : "–");
  const target = st && st.target_epsilon > 0 ? st.target_epsilon : null;
  drawChart($("chart-epsilon"), [
    { pts: steps.map((p) => [p.step, p.epsilon]), color: "#2563eb" },
  ], { y0: 0, hline: target });
  drawChart($("chart-accuracy"), [{ pts: evals.map((p) => [p.step, p.accuracy]), color: "#15803d", dots: true }], { y0: 0 });
  drawChart($("chart-loss"), [{ pts: evals.map((p) => [p.step, p.loss]), color: "#b45309", dots: true }], {});
  drawChart($("chart-latency"), [{ pts: led.map((p) => [p.step, p.round_seconds]), color: "#7c3aed" }], { y0: 0 });
  drawChart($("chart-participants"), [{ pts: led.map((p) => [p.step, p.participants]), color: "#0f766e" }], { y0: 0 });
}

// drawChart draws line series on canvas, with the y range and step range
// labelled, and records the number of points drawn in data-points.
function drawChart(canvas, series, opt) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 300, h = canvas.clientHeight || 160;
  canvas.width = Math.round(w * dpr);
  canvas.height = Math.round(h * dpr);
  const g = canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  let n = 0, x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const s of series) {
    for (const [x, y] of s.pts) {
      if (!Number.isFinite(x) || !Number.isFinite(y)) continue;
      n++; x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
    }
  }
  canvas.dataset.points = n;
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#6b7280";
  if (n === 0) {
    g.fillText("no data yet", 8, h / 2);
    return;
  }
  if (opt.y0 !== undefined) y0 = Math.min(y0, opt.y0);
  if (opt.hline) y1 = Math.max(y1, opt.hline);
  if (y1 === y0) { y1 += 1; }
  if (x1 === x0) { x1 += 1; }
  const pad = { l: 44, r: 8, t: 8, b: 18 };
  const X = (x) => pad.l + (x - x0) / (x1 - x0) * (w - pad.l - pad.r);
  const Y = (y) => h - pad.b - (y - y0) / (y1 - y0) * (h - pad.t - pad.b);
  g.strokeStyle = "#e5e7eb";
  g.lineWidth = 1;
  g.beginPath();
  g.moveTo(pad.l, pad.t); g.lineTo(pad.l, h - pad.b); g.lineTo(w - pad.r, h - pad.b);
  g.stroke();
  g.textAlign = "right";
  g.fillText(label(y1), pad.l - 4, pad.t + 8);
  g.fillText(label(y0), pad.l - 4, h - pad.b);
  g.textAlign = "left";
  g.fillText("step " + x0, pad.l, h - 4);
  g.textAlign = "right";
  g.fillText("step " + x1, w - pad.r, h - 4);
  if (opt.hline) {
    g.strokeStyle = "#b91c1c";
    g.setLineDash([4, 4]);
    g.beginPath(); g.moveTo(pad.l, Y(opt.hline)); g.lineTo(w - pad.r, Y(opt.hline)); g.stroke();
    g.setLineDash([]);
  }
  for (const s of series) {
    g.strokeStyle = s.color;
    g.fillStyle = s.color;
    g.lineWidth = 2;
    g.beginPath();
    let first = true;
    for (const [x, y] of s.pts) {
      if (!Number.isFinite(y)) continue;
      if (first) { g.moveTo(X(x), Y(y)); first = false; } else { g.lineTo(X(x), Y(y)); }
    }
    g.stroke();
    if (s.dots && s.pts.length <= 200) {
      for (const [x, y] of s.pts) {
        if (!Number.isFinite(y)) continue;
        g.beginPath(); g.arc(X(x), Y(y), 2.5, 0, 2 * Math.PI); g.fill();
      }
    }
  }
}

function label(v) {
  const a = Math.abs(v);
  if (a !== 0 && (a < 0.01 || a >= 10000)) return v.toExponential(1);
  return a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : v.toFixed(2);
}

async function getJSON(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

async function tick() {
  try {
    status = await getJSON("api/status");
    renderStatus(status);
    // The history is fetched again when the step moved; a long one (up
    // to 10,000 points, about 1 MB) at most every 5 s.
    const now = Date.now();
    const long = (history.steps || []).length > 2000;
    if (status.step !== lastHistoryStep && (!long || now - lastHistoryAt >= 5000)) {
      history = await getJSON("api/history");
      lastHistoryStep = status.step;
      lastHistoryAt = now;
      renderHistory(history, status);
    }
    set("error", "");
  } catch (e) {
    set("error", "· not updating: " + e.message);
  }
}

window.addEventListener("resize", () => renderHistory(history, status));
tick();
setInterval(tick, 1000);
