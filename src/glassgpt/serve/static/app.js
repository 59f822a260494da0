// glassgpt explorer: the page over /api/* (analyses) and /v1/completions (generation).
// Plain JS, no build step. State lives in `S`; each panel has one draw function.
"use strict";

const $ = (id) => document.getElementById(id);
const S = {
  info: null, vocab: null, data: null, prompt: "", pos: 0, token: null,
  layer: 0, head: 0, hover: null, cell: null, patterns: null, logits: null, seq: 0,
  ablated: new Set(), cut: null,  // heads ablated ("l.h"), and the logits with them ablated
  logitsStep: null, cutStep: null,  // the step each of those logits came from
  steps: [], step: null,  // the run's kept checkpoints, and the one chosen (null: the served model)
};
// A request about the analysis on show goes to its step (the slider may have moved on: the
// next analysis redraws everything), so that no panel mixes two models.
const at = () => (S.data && S.data.step !== null ? { step: S.data.step } : {});

function tag(id, step) {  // a panel's title says which model it shows (when the run has several)
  $(id).textContent = step === null ? "served model" : `step ${step}`;
  $(id).hidden = S.steps.length < 2;
}

// ---- helpers ---------------------------------------------------------------------------
function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value;
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function api(path, body) {
  const r = await fetch(path, body === undefined ? { headers: headers() }
    : { method: "POST", headers: headers(), body: JSON.stringify(body) });
  const out = await r.json();
  if (!r.ok) throw new Error(out.error ? out.error.message : r.statusText);
  return out;
}

function b64bytes(s) {
  const bin = atob(s), out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function show(text) {  // whitespace made visible in a token label
  return text.replace(/ /g, "·").replace(/\n/g, "↵").replace(/\t/g, "⇥") || "∅";
}

function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}

function pattern(layer, head) {  // [T, T] view of the uint8 patterns, as a function
  const T = S.data.tokens.length, base = ((layer * S.info.n_heads) + head) * T * T;
  return (q, k) => S.patterns[base + q * T + k] / 255;
}

function heat(p) {  // white → deep blue, for p in [0, 1]
  const c = (a, b) => Math.round(a + (b - a) * p);
  return `rgb(${c(255, 30)},${c(255, 64)},${c(255, 175)})`;
}

function diverging(v) {  // red (−1) → white (0) → blue (1), clamped
  if (v >= 0) return heat(Math.min(v, 1));
  const c = (a, b) => Math.round(a + (b - a) * Math.min(-v, 1));
  return `rgb(${c(255, 220)},${c(255, 38)},${c(255, 38)})`;
}

function stale(view, on) {  // a failed input leaves the last results on show, dimmed and marked
  document.body.classList.toggle("stale-" + view, on);
}

// One rule for every tab's input: a failure says why on the tab's status line and, when
// results of an earlier input are on show (`shown`: which), dims them and marks them stale;
// a success (error null) clears both.
function settle(view, statusId, error, shown = null) {
  const status = $(statusId);
  status.classList.toggle("error", error !== null);
  stale(view, error !== null && shown !== null);
  if (error !== null) status.textContent = error + (shown ? ` — ${shown}` : "");
}

// ---- loading ---------------------------------------------------------------------------
async function boot() {
  S.info = await api("/api/info");
  const i = S.info;
  $("model-info").textContent = `${i.model} · ${i.n_layers} layers × ${i.n_heads} heads · ` +
    `d_model ${i.d_model} · n_ctx ${i.n_ctx} · ${i.n_vocab} tokens`;
  $("api-key").hidden = !i.auth;
  if (!$("prompt").value) $("prompt").value = "The quick brown fox jumps over the lazy dog. The quick brown fox";
  if (!$("clean").value && !$("corrupted").value) {  // a pair of equal lengths on this tokenizer
    S.example = api("/api/patch/example").then((x) => {
      if ($("clean").value || $("corrupted").value) return;  // typed meanwhile
      $("clean").value = x.clean; $("corrupted").value = x.corrupted;
    }).catch(() => {});  // e.g. no API key yet: the prompts stay empty, the patch run says so
  }
  S.steps = (await api("/api/checkpoints")).steps;
  if (S.steps.length > 1) {
    $("ckpt").max = S.steps.length; $("ckpt").value = S.steps.length;  // the last stop: served
    $("ckpt-row").hidden = false;
    for (const t of document.querySelectorAll(".step-tag.served")) t.hidden = false;
  }
  drawScores();
  await analyze();
}

function selectStep() {  // the slider's stops: every kept step, then the served model
  const i = Number($("ckpt").value);
  S.step = i < S.steps.length ? S.steps[i] : null;
  $("ckpt-out").textContent = S.step === null ? "served" : `step ${S.step}`;
  schedule();
}

let timer = null;
function schedule() {
  clearTimeout(timer);
  timer = setTimeout(analyze, 250);
}

async function analyze() {
  const prompt = $("prompt").value;
  const seq = ++S.seq, t0 = performance.now();
  const fail = (msg) => settle("explore", "status", msg,
    S.data ? `the panels below still show the previous prompt, “${S.prompt.slice(0, 40)}”` : null);
  if (!prompt) { fail("Type a prompt to see inside the model."); return; }
  try {
    if (!S.vocab) S.vocab = await api("/api/vocab");
    const data = await api("/api/analyze", { prompt, ...(S.step === null ? {} : { step: S.step }) });
    if (seq !== S.seq) return;  // a newer prompt is on its way
    S.data = data; S.prompt = prompt;
    S.info.head_scores = data.head_scores; drawScores();
    S.patterns = b64bytes(data.patterns);
    S.pos = data.tokens.length - 1; S.hover = null; S.cell = null;
    setLogits(data);
    await fetchCut();
    $("status").textContent = `${data.tokens.length} tokens · analysed in ` +
      `${Math.round(performance.now() - t0)} ms`;
    settle("explore", "status", null);
    drawAll();
  } catch (e) {
    if (seq === S.seq) fail(e.message);
  }
}

function floats(s) { return new Float32Array(b64bytes(s).buffer); }

function setLogits(d) {
  S.logits = floats(d.logits); S.logitsStep = d.step;
  let best = 0;
  for (let i = 1; i < S.logits.length; i++) if (S.logits[i] > S.logits[best]) best = i;
  S.token = best;
}

async function fetchCut() {  // the logits at S.pos with the ablated heads' z set to 0
  if (!S.ablated.size) { S.cut = null; return; }
  const heads = [...S.ablated].map((k) => k.split(".").map(Number));
  const d = await api("/api/ablate", { prompt: S.prompt, pos: S.pos, heads, ...at() });
  S.cut = floats(d.logits); S.cutStep = d.step;
}

async function selectPos(p) {
  S.pos = p;
  const d = await api("/api/logits", { prompt: S.prompt, pos: p, ...at() });
  setLogits(d);
  await fetchCut();
  drawChips(); drawDist(); drawDLA();
}

async function toggleAblation(l, h) {
  const key = `${l}.${h}`;
  if (S.ablated.has(key)) S.ablated.delete(key); else S.ablated.add(key);
  try { await fetchCut(); } catch (e) { failed("dist")(e); return; }
  drawGrid(); drawDist(); drawDLA();  // the DLA's title says whether heads are ablated
}

function failed(id) {  // a panel whose data could not be fetched says why
  return (e) => { const box = $(id); box.textContent = ""; box.append(el("span", { class: "error" }, e.message)); };
}

function drawAll() {
  drawChips(); drawDist(); drawDLA(); drawGrid(); drawBig(); drawLens(); drawCircuits();
  $("out-prompt").textContent = S.prompt;
}

// ---- tokens ----------------------------------------------------------------------------
function drawChips() {
  const box = $("chips"); box.textContent = "";
  const toks = S.data.tokens, h = S.hover;
  const A = pattern(S.layer, S.head);
  toks.forEach((t, i) => {
    const hex = t.bytes.map((b) => b.toString(16).padStart(2, "0")).join(" ");
    const chip = el("span", { class: "chip", "data-i": i,
      title: `#${i} · id ${t.id} · bytes ${hex || "(none)"}` }, show(t.text));
    if (i === S.pos) chip.classList.add("selected");
    if (h !== null) {
      if (i === h) chip.classList.add("hovered");
      const to = i <= h ? A(h, i) : 0, by = i >= h ? A(i, h) : 0;
      chip.style.background = `rgba(37, 99, 235, ${(0.85 * to).toFixed(3)})`;
      if (to > 0.5) chip.style.color = "#fff";
      chip.style.setProperty("--under", `rgba(234, 88, 12, ${by.toFixed(3)})`);
    }
    chip.addEventListener("mouseenter", () => hoverToken(i));
    chip.addEventListener("mouseleave", () => hoverToken(null));
    chip.addEventListener("click", () => selectPos(i));
    box.append(chip);
  });
}

function hoverToken(i) {
  if (S.hover === i) return;
  S.hover = i;
  drawChips(); drawGrid(); drawBig();
}

// ---- next-token distribution (seed 002's temperature equation, live) -----------------
const orders = new WeakMap();
function distribution(z) {  // p = softmax(z / T) after top-k and top-p; base = softmax(z)
  const V = z.length;
  const T = +$("temperature").value, k = +$("top-k").value, topP = +$("top-p").value;
  if (!orders.has(z)) orders.set(z, Array.from(z.keys()).sort((a, b) => z[b] - z[a]));
  const order = orders.get(z);  // sorted once per array of logits
  const softmax = (vals) => {
    const m = Math.max(...vals.filter(Number.isFinite));
    const e = vals.map((v) => (Number.isFinite(v) ? Math.exp(v - m) : 0));
    const s = e.reduce((a, b) => a + b, 0);
    return e.map((x) => x / s);
  };
  const base = softmax(Array.from(z));
  let p;
  if (T === 0) {
    p = new Array(V).fill(0); p[order[0]] = 1;
  } else {
    let zt = Array.from(z, (v) => v / T);
    if (k > 0 && k < V) {
      const kth = zt[order[k - 1]];
      zt = zt.map((v) => (v < kth ? -Infinity : v));
    }
    if (topP < 1) {
      const q = softmax(zt);
      let before = 0;
      for (const i of order) { if (before >= topP) zt[i] = -Infinity; before += q[i]; }
    }
    p = softmax(zt);
  }
  return { p, base, order };
}

function drawDist() {
  const T = +$("temperature").value, k = +$("top-k").value, topP = +$("top-p").value;
  $("temperature-out").textContent = T.toFixed(2) + (T === 0 ? " (greedy)" : "");
  $("top-k-out").textContent = k ? String(k) : "off";
  $("top-p-out").textContent = topP.toFixed(2);
  const t = S.data.tokens[S.pos];
  $("dist-where").textContent = `after #${S.pos} “${show(t.text)}”`;
  tag("dist-step", S.logitsStep);
  const cut = S.cut !== null && S.cutStep === S.logitsStep;  // never two models' logits
  const { p, base, order } = distribution(cut ? S.cut : S.logits);
  const ghost = cut ? distribution(S.logits).p : base;  // behind: unablated, or T = 1 unfiltered
  if (cut) $("dist-where").textContent += ` · ${S.ablated.size} head${S.ablated.size > 1 ? "s" : ""} ablated`;
  $("dist-legend").textContent = "p = softmax(z / T) over the tokens that top-k and top-p keep; bars on a scale of 0 to 1; " +
    (cut ? "faint bars and ticks: without the ablation" : "faint bars: T = 1, unfiltered");
  const box = $("dist"); box.textContent = "";
  const top = order.slice(0, 12).sort((a, b) => p[b] - p[a] || ghost[b] - ghost[a]);
  for (const i of top) {
    const row = { class: "clickable" + (i === S.token ? " chosen" : ""),
      onclick: () => { S.token = i; drawDist(); drawDLA(); } };
    const was = cut ? ` (was ${(100 * ghost[i]).toFixed(1)}%)` : "";
    box.append(
      el("span", { ...row, class: "label " + row.class }, show(S.vocab[i])),
      el("span", { class: "track", onclick: row.onclick },
        el("span", { class: "ghost", style: `width:${(100 * ghost[i]).toFixed(2)}%` }),
        el("span", { class: "fill", style: `width:${(100 * p[i]).toFixed(2)}%` }),
        ...(cut ? [el("span", { class: "tick", style: `left:${(100 * ghost[i]).toFixed(2)}%` })] : [])),
      el("span", { class: "num" }, (100 * p[i]).toFixed(1) + "%" + was));
  }
  const kept = p.filter((x) => x > 0).length;
  const H = -p.reduce((a, x) => a + (x > 0 ? x * Math.log2(x) : 0), 0);
  $("dist-stats").textContent = `${kept} of ${p.length} tokens kept · entropy ${H.toFixed(2)} bits`;
}

// ---- direct logit attribution ----------------------------------------------------------
function drawDLA() { return attribution().catch(failed("dla")); }

let dlaTicket = 0;
async function attribution() {
  const ticket = ++dlaTicket;
  const d = await api("/api/attribution", { prompt: S.prompt, pos: S.pos, token: S.token, ...at() });
  if (ticket !== dlaTicket) return;  // a newer request has been made
  // Attributing the ablated model would take a forward per part; the panel says it is not.
  const unablated = S.ablated.size ? " · of the unablated model" : "";
  $("dla-where").textContent = `of “${show(d.text)}” after #${d.pos}${unablated}`;
  tag("dla-step", d.step);
  const box = $("dla"); box.textContent = "";
  const scale = Math.max(...d.bars.map((b) => Math.abs(b.value)), Math.abs(d.total), 1e-9);
  const bar = (name, v, cls = "") => {
    const w = (50 * Math.abs(v) / scale).toFixed(1);
    const left = v >= 0 ? 50 : 50 - w;
    box.append(
      el("span", { class: "label " + cls }, name),
      el("span", { class: "track" }, el("span", { class: "mid", style: "left:50%" }),
        el("span", { class: "fill " + (v >= 0 ? "pos" : "neg"), style: `left:${left}%;width:${w}%` })),
      el("span", { class: "num " + cls }, v.toFixed(3)));
  };
  for (const b of d.bars) bar(b.name.replace("blocks.", "L").replace(".attn.h", " H").replace(".attn.", " attn ").replace(".mlp", " mlp"), b.value);
  bar(`Σ = logit ${d.logit.toFixed(3)}`, d.total, "total");
}

// ---- attention -------------------------------------------------------------------------
const bases = new Map();  // the undimmed heatmap of each (prompt, checkpoint, head, size), drawn once
function base(layer, head, size) {
  const key = `${S.prompt}|${S.data.step}|${layer}|${head}|${size}`;  // the step on show
  let src = bases.get(key);
  if (src) return src;
  const T = S.data.tokens.length, A = pattern(layer, head), c = size / T;
  src = document.createElement("canvas");
  src.width = src.height = size;
  const g = src.getContext("2d");
  g.fillStyle = "#fff"; g.fillRect(0, 0, size, size);
  for (let q = 0; q < T; q++) {
    for (let k = 0; k <= q; k++) {
      g.fillStyle = heat(Math.sqrt(A(q, k)));  // √p: weak attention stays visible
      g.fillRect(k * c, q * c, Math.ceil(c), Math.ceil(c));
    }
  }
  if (bases.size > 2 * S.info.n_layers * S.info.n_heads + 4) bases.delete(bases.keys().next().value);
  bases.set(key, src);
  return src;
}

function paint(canvas, layer, head, size) {  // dims all but the hovered token's row and column
  const T = S.data.tokens.length, src = base(layer, head, size), h = S.hover, c = size / T;
  canvas.width = canvas.height = size;
  const g = canvas.getContext("2d");
  g.fillStyle = "#fff"; g.fillRect(0, 0, size, size);
  if (h === null) { g.drawImage(src, 0, 0); return g; }
  g.globalAlpha = 0.18; g.drawImage(src, 0, 0); g.globalAlpha = 1;
  g.drawImage(src, 0, h * c, (h + 1) * c, c, 0, h * c, (h + 1) * c, c);  // row h: its keys
  g.drawImage(src, h * c, h * c, c, (T - h) * c, h * c, h * c, c, (T - h) * c);  // column h
  g.strokeStyle = "#ea580c"; g.lineWidth = Math.max(1, size / 400);
  g.strokeRect(0, h * c, (h + 1) * c, c);
  g.strokeRect(h * c, h * c, c, (T - h) * c);
  return g;
}

function drawGrid() {
  const grid = $("grid"), i = S.info;
  grid.style.gridTemplateColumns = `28px repeat(${i.n_heads}, 66px)`;
  grid.textContent = "";
  grid.append(el("span"));
  for (let h = 0; h < i.n_heads; h++) grid.append(el("span", { class: "hdr" }, "H" + h));
  for (let l = 0; l < i.n_layers; l++) {
    grid.append(el("span", { class: "hdr" }, "L" + l));
    for (let h = 0; h < i.n_heads; h++) {
      const cut = S.ablated.has(`${l}.${h}`);
      const c = el("canvas", { title: `layer ${l}, head ${h}`, "data-head": `${l}.${h}` });
      if (l === S.layer && h === S.head) c.classList.add("selected");
      c.addEventListener("click", () => selectHead(l, h));
      paint(c, l, h, 128);
      const off = el("button", { class: "ablate" + (cut ? " on" : ""), "data-head": `${l}.${h}`,
        title: (cut ? "restore" : "zero-ablate") + ` L${l}H${h}`, onclick: () => toggleAblation(l, h) }, "⊘");
      grid.append(el("span", { class: "cell" + (cut ? " cut" : "") }, c, off));
    }
  }
  const names = [...S.ablated].map((k) => "L" + k.replace(".", "H"));
  $("ablated").textContent = names.length ? "ablated: " + names.join(", ") : "";
}

// The enlarged head: a canvas of T × T cells with a label for every row and column (DOM
// spans, so they can be hovered), cells ≥ 12 px (the box scrolls past the card's width).
const BIG = { key: "", cell: 0 };

function layoutBig() {
  const T = S.data.tokens.length, wrap = $("big-wrap");
  const room = Math.max(300, Math.min(wrap.clientWidth - 90, 720));  // in sight at 900 px high
  const cell = Math.max(12, Math.min(36, Math.floor(room / T)));
  const key = `${S.prompt}|${cell}`;
  if (key === BIG.key) return;
  BIG.key = key; BIG.cell = cell;
  const font = Math.min(13, cell - 1), chars = 8;
  const rows = $("big-rows"), cols = $("big-cols");
  rows.textContent = ""; cols.textContent = "";
  rows.style.gridTemplateRows = cols.style.gridTemplateColumns = `repeat(${T}, ${cell}px)`;
  rows.style.fontSize = cols.style.fontSize = font + "px";
  S.data.tokens.forEach((t, i) => {
    for (const box of [rows, cols]) {
      const lab = el("span", { class: "lab", "data-i": i, title: `#${i} “${show(t.text)}”` }, show(t.text).slice(0, chars));
      lab.addEventListener("mouseenter", () => { S.cell = null; hoverToken(i); });
      lab.addEventListener("mouseleave", () => hoverToken(null));
      box.append(lab);
    }
  });
  const canvas = $("big");
  canvas.style.width = canvas.style.height = T * cell + "px";
}

function drawBig() {
  $("head-name").textContent = `L${S.layer}H${S.head}`;
  tag("attn-step", S.data.step);
  layoutBig();
  const T = S.data.tokens.length, dpr = window.devicePixelRatio || 1;
  const size = Math.round(T * BIG.cell * dpr);
  const g = paint($("big"), S.layer, S.head, size);
  if (S.cell) {  // the cell under the pointer
    const c = size / T, [q, k] = S.cell;
    g.strokeStyle = "#111827"; g.lineWidth = Math.max(1.5, dpr * 1.5);
    g.strokeRect(k * c, q * c, c, c);
  }
  const [q, k] = S.cell || [S.hover, S.hover];
  $("big-rows").querySelectorAll(".lab").forEach((lab, i) => lab.classList.toggle("on", i === q));
  $("big-cols").querySelectorAll(".lab").forEach((lab, i) => lab.classList.toggle("on", i === k));
}

function readout(q, k) {
  const toks = S.data.tokens, A = pattern(S.layer, S.head);
  const w = k <= q ? A(q, k) : 0;
  $("big-readout").textContent = `query #${q} “${show(toks[q].text)}” → key #${k} “${show(toks[k].text)}”: ` +
    `${w.toFixed(3)}` + (k > q ? " (a later key: masked)" : "");
}

$("big").addEventListener("mousemove", (ev) => {
  if (!S.data) return;
  const r = ev.target.getBoundingClientRect(), T = S.data.tokens.length;
  const q = Math.min(T - 1, Math.floor((ev.clientY - r.top) / r.height * T));
  const k = Math.min(T - 1, Math.floor((ev.clientX - r.left) / r.width * T));
  if (S.cell && S.cell[0] === q && S.cell[1] === k) return;
  S.cell = [q, k];
  readout(q, k);
  if (S.hover === q) drawBig(); else hoverToken(q);
});
$("big").addEventListener("mouseleave", () => {
  S.cell = null; $("big-readout").textContent = "Hover a cell: query → key: weight.";
  if (S.hover === null) drawBig(); else hoverToken(null);
});

function selectHead(l, h) {
  S.layer = l; S.head = h;
  drawChips(); drawGrid(); drawBig(); drawScores(); drawCircuits();
}

// ---- logit lens, head scores, circuits -------------------------------------------------
function drawLens() {
  const t = $("lens"); t.textContent = "";
  tag("lens-step", S.data.step);
  const head = el("tr", {}, el("th", { class: "row" }, "layer \\ token"));
  S.data.tokens.forEach((tok, i) => head.append(el("th", { class: "col", title: `#${i}` }, show(tok.text))));
  t.append(head);
  for (const row of S.data.lens) {
    const name = row.name.replace("blocks.0.resid_pre", "embed").replace(/blocks\.(\d+)\.resid_post/, "after L$1");
    const tr = el("tr", {}, el("th", { class: "row" }, name));
    row.cells.forEach((c) => {
      const p = c.p[0];
      const alts = c.top.map((x, j) => `${show(x)} ${(100 * c.p[j]).toFixed(1)}%`).join("  ");
      tr.append(el("td", { style: `background:${heat(p)};color:${p > 0.55 ? "#fff" : "#111"}`, title: alts },
        show(c.top[0]), el("span", { class: "p" }, (100 * p).toFixed(0) + "%")));
    });
    t.append(tr);
  }
}

function drawScores() {  // one layer × head table per score; a cell selects its head
  const box = $("scores"), i = S.info, s = i.head_scores; box.textContent = "";
  tag("scores-step", S.data ? S.data.step : null);
  for (const [key, title] of [["previous_token", "previous token"], ["induction", "induction"], ["duplicate_token", "duplicate token"]]) {
    const t = el("table", { class: "scores" }, el("caption", {}, title));
    const hdr = el("tr", {}, el("th"));
    for (let h = 0; h < i.n_heads; h++) hdr.append(el("th", {}, "H" + h));
    t.append(hdr);
    for (let l = 0; l < i.n_layers; l++) {
      const tr = el("tr", {}, el("th", {}, "L" + l));
      for (let h = 0; h < i.n_heads; h++) {
        const v = s[key][l][h];
        const td = el("td", { class: "head" + (l === S.layer && h === S.head ? " selected" : ""),
          title: `L${l}H${h} ${title}: ${v.toFixed(3)}`,
          style: `background:${heat(v)};color:${v > 0.55 ? "#fff" : "#111"}` }, v.toFixed(2));
        td.addEventListener("click", () => selectHead(l, h));
        tr.append(td);
      }
      t.append(tr);
    }
    box.append(t);
  }
}

function drawCircuits() { return circuits().catch(failed("qk")); }

let circuitTicket = 0;
async function circuits() {
  const ticket = ++circuitTicket, l = S.layer, h = S.head;
  const d = await api("/api/circuits", { prompt: S.prompt, layer: l, head: h, ...at() });
  if (ticket !== circuitTicket) return;
  $("circuit-name").textContent = `of L${l}H${h}`;
  tag("circuits-step", d.step);
  const table = (id, title, cols, rows) => {
    const t = $(id); t.textContent = "";
    t.append(el("caption", {}, title), el("tr", {}, ...cols.map((c) => el("th", {}, c))));
    for (const [a, b, v] of rows) t.append(el("tr", {}, el("td", { class: "t" }, show(a)), el("td", { class: "t" }, show(b)), el("td", { class: "v" }, v.toFixed(3))));
  };
  table("qk", "QK: top pairs", ["query", "key", "score"], d.qk);
  table("ov", "OV: top pairs", ["source", "output", "logit"], d.ov);
}

// ---- activation patching -------------------------------------------------------------
const P = { data: null, body: null, cell: null, seq: 0 };

function tokenArg(v) {  // "#12" → id 12; other text is the token's text; "" → the default
  if (v === "") return undefined;
  const m = /^#(\d+)$/.exec(v);
  return m ? +m[1] : v;
}

async function runPatch() {
  const body = { clean: $("clean").value, corrupted: $("corrupted").value };
  for (const f of ["answer", "wrong"]) { const v = tokenArg($(f).value); if (v !== undefined) body[f] = v; }
  const seq = ++P.seq, t0 = performance.now(), status = $("patch-status");
  status.textContent = "patching…"; status.classList.remove("error");
  $("patch-run").disabled = true;
  try {
    const d = await api("/api/patch", body);
    if (seq !== P.seq) return;
    P.data = d; P.body = { ...body, answer: d.answer.id, wrong: d.wrong.id }; P.cell = null;
    status.textContent = `${d.clean.length} tokens each · m = z[“${show(d.answer.text)}”] − z[“${show(d.wrong.text)}”]: ` +
      `clean ${d.diff.clean.toFixed(3)}, corrupted ${d.diff.corrupted.toFixed(3)} · ` +
      `${Math.round(performance.now() - t0)} ms` +
      (d.small_gap ? " · the two runs differ little in m, so m̂ is mostly noise and may pass 0 or 1" : "");
    settle("patch", "patch-status", null);
    drawPatch();
    const [l, t] = best(d.resid_pre);
    await patchEffect("resid_pre", l, t);
  } catch (e) {
    if (seq !== P.seq) return;
    settle("patch", "patch-status", e.message, P.data ? "the results below are from the previous run" : null);
  } finally {
    $("patch-run").disabled = false;
  }
}

function best(rows) {  // [row, column] of the largest value
  let at = [0, 0];
  rows.forEach((r, i) => r.forEach((v, j) => { if (v > rows[at[0]][at[1]]) at = [i, j]; }));
  return at;
}

function compact(v) {  // 0.12 → ".12", −0.004 → ".00": two decimals in three or four characters
  return (Math.abs(v) < 0.005 ? 0 : v).toFixed(2).replace(/^(-?)0\./, "$1.");
}

function patchCell(v, site, layer, index, title) {
  const td = el("td", { class: "pcell", "data-site": site, "data-layer": layer, "data-index": index,
    title: `${title}: m̂ = ${v.toFixed(3)}`,
    style: `background:${diverging(v)};color:${Math.abs(v) > 0.55 ? "#fff" : "#111"}` }, compact(v));
  if (P.cell && P.cell.site === site && P.cell.layer === layer && P.cell.index === index) td.classList.add("selected");
  td.addEventListener("click", () => patchEffect(site, layer, index));
  return td;
}

function drawPatch() {
  const d = P.data;
  const t = $("patch-resid"); t.textContent = "";
  const differs = d.clean.map((x, i) => x !== d.corrupted[i]);
  for (const [name, toks] of [["clean", d.clean], ["corrupted", d.corrupted]]) {
    const tr = el("tr", {}, el("th", { class: "row" }, name));
    toks.forEach((x, i) => tr.append(el("th", { class: "col" + (differs[i] ? " diff" : ""), title: `#${i}` }, show(x))));
    t.append(tr);
  }
  d.resid_pre.forEach((row, l) => {
    const tr = el("tr", {}, el("th", { class: "row" }, `L${l}`));
    row.forEach((v, i) => tr.append(patchCell(v, "resid_pre", l, i, `resid_pre L${l} at #${i} “${show(d.corrupted[i])}”`)));
    t.append(tr);
  });
  const h = $("patch-heads"); h.textContent = "";
  const hdr = el("tr", {}, el("th"));
  d.heads[0].forEach((_, j) => hdr.append(el("th", {}, "H" + j)));
  h.append(hdr);
  d.heads.forEach((row, l) => {
    const tr = el("tr", {}, el("th", { class: "row" }, `L${l}`));
    row.forEach((v, j) => tr.append(patchCell(v, "head", l, j, `L${l}H${j}`)));
    h.append(tr);
  });
}

let effectTicket = 0;
async function patchEffect(site, layer, index) {
  const ticket = ++effectTicket;
  P.cell = { site, layer, index };
  drawPatch();
  const box = $("patch-effect");
  try {
    const e = await api("/api/patch/effect", { ...P.body, site, layer, index });
    if (ticket !== effectTicket) return;  // a later cell was clicked
    const where = site === "resid_pre" ? `resid_pre of L${layer} at #${index} “${show(P.data.corrupted[index])}”` : `L${layer}H${index}`;
    $("effect-where").textContent = `of patching ${where}: m̂ = ${e.value.toFixed(3)}`;
    box.textContent = "";
    for (const r of e.rows) {
      const mark = r.id === e.answer ? " ✓" : r.id === e.wrong ? " ✗" : "";
      const w = (p) => `width:${(100 * p).toFixed(2)}%`;
      box.append(
        el("span", { class: "label", title: `id ${r.id}` }, show(r.text) + mark),
        el("span", { class: "track" },
          el("span", { class: "fill clean", style: w(r.clean) }),
          el("span", { class: "fill corrupted", style: w(r.corrupted) }),
          el("span", { class: "fill patched", style: w(r.patched) })),
        el("span", { class: "num" }, ["clean", "corrupted", "patched"].map((k) => (100 * r[k]).toFixed(1) + "%").join(" / ")));
    }
  } catch (err) { failed("patch-effect")(err); }
}

function setView(view) {
  document.body.dataset.view = view;
  for (const b of document.querySelectorAll(".tab")) b.classList.toggle("on", b.dataset.view === view);
  if (view === "patch" && !P.data && P.seq === 0) Promise.resolve(S.example).then(runPatch);
  if (view === "explore" && S.data) drawBig();  // its size follows the card's width
}

// ---- generation over the API -----------------------------------------------------------
async function generate() {
  const btn = $("generate"), out = $("out-new");
  btn.disabled = true; out.textContent = ""; $("out-prompt").textContent = S.prompt;
  const body = { model: S.info.model, prompt: $("prompt").value, stream: true,
    max_tokens: +$("max-tokens").value || 64, temperature: +$("temperature").value,
    top_p: +$("top-p").value, seed: +$("seed").value };
  if (+$("top-k").value) body.top_k = +$("top-k").value;
  try {
    const r = await fetch("/v1/completions", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!r.ok) throw new Error((await r.json()).error.message);
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const line = buf.slice(0, cut); buf = buf.slice(cut + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const chunk = JSON.parse(line.slice(6));
        if (chunk.error) throw new Error(chunk.error.message);
        for (const c of chunk.choices) out.textContent += c.text;
      }
    }
  } catch (e) {
    out.append(el("span", { class: "error" }, " [" + e.message + "]"));
  } finally {
    btn.disabled = false;
  }
}

// ---- wiring ----------------------------------------------------------------------------
$("prompt").addEventListener("input", schedule);
$("ckpt").addEventListener("input", selectStep);
for (const id of ["temperature", "top-k", "top-p"]) $(id).addEventListener("input", () => S.data && drawDist());
$("generate").addEventListener("click", generate);
$("patch-run").addEventListener("click", runPatch);
for (const id of ["answer", "wrong", "clean", "corrupted"]) {  // Enter (Ctrl+Enter in a prompt) runs
  $(id).addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.target.tagName === "INPUT")) { ev.preventDefault(); runPatch(); }
  });
}
for (const b of document.querySelectorAll(".tab")) b.addEventListener("click", () => setView(b.dataset.view));
window.addEventListener("resize", () => S.data && drawBig());
$("api-key").addEventListener("change", () => { S.vocab = null; analyze(); });
document.body.dataset.view = "explore";
boot().catch((e) => { $("status").textContent = e.message; $("status").classList.add("error"); });
