// glassgpt explorer: the page over /api/* (analyses) and /v1/completions (generation).
// Plain JS, no build step. State lives in `S`; each panel has one draw function. This file
// holds the state, the helpers, the stale/settle rule and the loading of an analysis.
// index.html loads, in order: app.js; the views' draw functions (explore.js, heads.js,
// patching.js); main.js, which wires the controls and starts the page; features.js.
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
  const kv = i.n_kv_heads < i.n_heads ? ` (${i.n_kv_heads} K/V)` : "";  // grouped-query
  const served = i.context < i.n_ctx ? ` (serving ${i.context})` : "";
  $("model-info").textContent = `${i.model} · ${i.n_layers} layers × ${i.n_heads} heads${kv} · ` +
    `d_model ${i.d_model} · n_ctx ${i.n_ctx}${served} · ${i.n_vocab} tokens`;
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
  const seq = S.cutSeq = (S.cutSeq || 0) + 1;  // only the latest call's answer is kept
  if (!S.ablated.size) { S.cut = null; return; }
  const heads = [...S.ablated].map((k) => k.split(".").map(Number));
  const d = await api("/api/ablate", { prompt: S.prompt, pos: S.pos, heads, ...at() });
  if (seq === S.cutSeq) { S.cut = floats(d.logits); S.cutStep = d.step; }
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

function setView(view) {
  document.body.dataset.view = view;
  for (const b of document.querySelectorAll(".tab")) b.classList.toggle("on", b.dataset.view === view);
  if (view === "patch" && !P.data && P.seq === 0) Promise.resolve(S.example).then(runPatch);
  if (view === "explore" && S.data) drawBig();  // its size follows the card's width
}
