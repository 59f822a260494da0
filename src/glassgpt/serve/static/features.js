// glassgpt explorer, Features view: an SAE's latents over /api/features/* (search, a page per
// latent, a prompt's per-token activations, steering by a latent). Loaded after app.js, whose
// helpers ($, api, el, show, heat) it uses. The tab appears only when the server has an SAE.
"use strict";

const F = { info: null, page: null, id: null, toks: null, prompt: "", pin: null, seq: 0 };

async function featuresBoot() {
  try { F.info = await api("/api/features/info"); } catch (e) { return; }  // e.g. no API key yet
  if (!F.info.sae) return;  // no SAE: no tab
  $("tab-features").hidden = false;
  const i = F.info;
  if (i.clt) cltControls(i.clt);
  $("feat-sae").textContent = `${i.arch}${i.k ? " k=" + i.k : ""} · ` +
    (i.clt ? `${i.clt.n_layers} layers × ${i.clt.d_sae} features on ${i.hook}` : `${i.d_sae} latents on ${i.hook}`) +
    (i.pages ? ` · pages over ${i.tokens.toLocaleString()} tokens` : " · no pages (glassgpt sae features)");
  if (!$("feat-prompt").value) $("feat-prompt").value = $("prompt").value || "To be, or not to be";
  await openFeature(0);
}

// A token shaded by an activation: orange of opacity α over the white card, its text black or
// white, whichever contrasts more (one of them always reaches WCAG AA's 4.5:1).
function shade(span, a, m) {
  const alpha = Math.min(1, 0.1 + 0.9 * a / m);
  span.style.background = `rgba(234, 88, 12, ${alpha.toFixed(3)})`;
  const lin = (c) => { const v = (255 + (c - 255) * alpha) / 255; return v <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const L = 0.2126 * lin(234) + 0.7152 * lin(88) + 0.0722 * lin(12);
  span.style.color = (L + 0.05) / 0.05 >= 1.05 / (L + 0.05) ? "#000" : "#fff";
}

// A CLT's features are numbered as its pages number them (feature i of layer l is l · d_sae + i)
// and shown as l/i, picked with a layer selector beside the feature's number.
function featName(id) {
  const c = F.info && F.info.clt;
  return c ? `${Math.floor(id / c.d_sae)}/${id % c.d_sae}` : String(id);
}

function cltControls(c) {
  const sel = el("select", { id: "feat-layer", title: "the layer whose MLP input the feature reads" });
  for (let l = 0; l < c.n_layers; l++) sel.append(el("option", { value: l }, `layer ${l}`));
  $("feat-id").before(sel, " ");
  $("feat-id").max = c.d_sae - 1;
  sel.addEventListener("change", () => openFeature(+sel.value * c.d_sae + Math.min(c.d_sae - 1, +$("feat-id").value || 0)));
}

function featNorms(rows) {  // a CLT feature's writes: ‖W_dec‖ per target layer, as bars
  const top = Math.max(...rows.map((r) => r.norm), 1e-12);
  const t = el("table", { class: "pairs", id: "feat-norms" }, el("caption", {}, "decoder norm per target layer"));
  for (const r of rows) t.append(el("tr", {}, el("td", { class: "t" }, `layer ${r.layer}`),
    el("td", {}, el("span", { style: `display:inline-block;height:8px;background:var(--orange);width:${(80 * r.norm / top).toFixed(1)}px` })),
    el("td", { class: "v" }, fmt(r.norm))));
  return t;
}

function fmt(v) { return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(2); }

// ---- search ----------------------------------------------------------------------------
let searchTimer = null;
async function featSearch() {
  const q = $("feat-query").value, box = $("feat-results");
  if (!q) { box.textContent = ""; return; }
  try {
    const d = await api("/api/features/search", { query: q, limit: 40 });
    if (q !== $("feat-query").value) return;
    box.textContent = "";
    $("feat-results-n").textContent = `${d.total} match${d.total === 1 ? "" : "es"}`;
    for (const r of d.results) {
      const why = r.why === "id" ? "id" : r.why === "label" ? `label “${r.label}”` : r.why === "token" ? `top token ×${r.matches}` : `in context ×${r.matches}`;
      box.append(el("button", { class: "result", "data-id": r.id, onclick: () => openFeature(r.id) },
        el("b", {}, "#" + featName(r.id)), el("span", { class: "tok" }, r.top_token === null ? "—" : show(r.top_token)),
        el("span", { class: "muted" }, `${why} · density ${(100 * r.density).toFixed(3)}% · max ${fmt(r.max)}`)));
    }
  } catch (e) { failed("feat-results")(e); }
}

// ---- a feature's page ------------------------------------------------------------------
async function openFeature(id) {
  F.id = id;
  const c = F.info.clt;
  $("feat-id").value = c ? id % c.d_sae : id;
  if (c) $("feat-layer").value = Math.floor(id / c.d_sae);
  let page = null;
  try {
    page = F.info.pages ? await api(`/api/features/page/${id}`) : null;
  } catch (e) { if (F.id === id) failed("feat-contexts")(e); }
  if (F.id !== id) return;  // another feature was opened meanwhile: its page is the one to draw
  F.page = page;
  drawPage();
  drawFeatChips();
  const R = Math.max(1, Math.ceil(4 * (F.page && F.page.max ? F.page.max : 2)));
  const v = $("feat-value");
  v.min = -R; v.max = R; v.step = R / 200;
  if ($("feat-mode").value === "clamp") v.min = 0;
  await featRun();
}

function drawPage() {
  const p = F.page, id = F.id;
  $("feat-title").textContent = `#${featName(id)}`;
  // the label sae label wrote, and how well it let a reader find the feature (detection)
  if (!$("feat-label")) $("feat-title").after(el("span", { id: "feat-label", style: "margin-left:.5em;font-weight:500" }));
  const lab = p && p.label, tag = $("feat-label");
  tag.textContent = lab ? `“${lab.label}”` : "";
  tag.title = lab ? "label written by glassgpt sae label" : "";
  if (lab && lab.detection !== null && lab.detection !== undefined)
    tag.append(el("span", { class: "muted small", title: "balanced accuracy of telling held-out activating contexts from silent ones, given the label (0.5: chance)" },
      ` · detection ${lab.detection.toFixed(2)}`));
  for (const k of ["feat-stats", "feat-hist", "feat-logits", "feat-contexts"]) $(k).textContent = "";
  if (!p) { $("feat-stats").textContent = "no page: run glassgpt sae features on this SAE"; return; }
  $("feat-stats").textContent = `density ${(100 * p.density).toFixed(4)}% (${p.count.toLocaleString()} of ` +
    `${p.tokens.toLocaleString()} tokens) · max activation ${fmt(p.max)}`;
  // histogram of the nonzero activations, log-spaced bins
  const h = $("feat-hist"), top = Math.max(1, ...p.histogram.map((b) => b.count));
  for (const b of p.histogram) {
    const range = `${fmt(b.lo)} ≤ f < ${b.hi === null ? "∞" : fmt(b.hi)}: ${b.count}`;
    h.append(el("span", { class: "hbar", title: range },
      el("span", { style: `height:${(100 * b.count / top).toFixed(1)}%` })));
  }
  if (p.histogram.length) {
    const a = p.histogram[0], z = p.histogram[p.histogram.length - 1];
    $("feat-hist-axis").textContent = `${fmt(a.lo)} … ${z.hi === null ? "∞" : fmt(z.hi)} (log scale; tallest bar ${top.toLocaleString()} tokens)`;
  } else $("feat-hist-axis").textContent = "never active on the corpus";
  // logit effect
  const lg = $("feat-logits");
  for (const [title, rows, cls] of [["promotes", p.logit_top, "pos"], ["suppresses", p.logit_bottom, "neg"]]) {
    const t = el("table", { class: "pairs" }, el("caption", {}, title));
    for (const r of rows) t.append(el("tr", {}, el("td", { class: "t" }, show(r.text)), el("td", { class: "v " + cls }, r.value.toFixed(3))));
    lg.append(t);
  }
  if (p.decoder_norms) lg.append(featNorms(p.decoder_norms));
  // top contexts, each token shaded by this latent's activation there
  const box = $("feat-contexts"), m = p.max || 1;
  for (const c of p.contexts) {
    const line = el("div", { class: "ctx" });
    c.tokens.forEach((t, j) => {
      const a = c.acts[j], s = el("span", { class: "ct" + (j === c.at ? " at" : ""), title: `f = ${a.toFixed(4)}` }, show(t));
      if (a > 0) shade(s, a, m);
      line.append(s);
    });
    box.append(el("span", { class: "cv" }, fmt(c.value)), line);
  }
}

// ---- the prompt: its activations and the steered distribution, fetched together --------
// A prompt that cannot be read (empty, too long, an unknown character) is settled by app.js's
// one rule: the message on the prompt's status line, the last prompt's chips, bars, KL and
// samples dimmed and marked stale.
async function featRun() {
  const prompt = $("feat-prompt").value, seq = ++F.seq;
  drawEq();
  const fail = (msg) => settle("features", "feat-prompt-status", msg,
    F.toks ? `the chips and the steering below still show the previous prompt, “${F.prompt.slice(0, 40)}”` : null);
  if (!prompt) { fail("Type a prompt to see its features."); return; }
  const mode = $("feat-mode").value;
  const body = { prompt, feature: F.id, mode, value: +$("feat-value").value,
    max_tokens: +$("feat-max").value || 0, temperature: +$("feat-temp").value, seed: +$("feat-seed").value };
  try {
    const [d, s] = await Promise.all([api("/api/features/tokens", { prompt, top: 8, feature: F.id }),
      api("/api/features/steer", body)]);
    if (seq !== F.seq) return;  // a newer prompt or setting is on its way
    F.toks = d; F.prompt = prompt;
    $("feat-prompt-status").textContent = "";
    settle("features", "feat-prompt-status", null);
    if (F.pin !== null && F.pin >= d.tokens.length) F.pin = null;
    drawFeatChips(); drawTokenTop(F.pin); drawSteer(s);
  } catch (e) {
    if (seq === F.seq) fail(e.message);
  }
}

function drawFeatChips() {
  const box = $("feat-chips"), d = F.toks;
  box.textContent = "";
  if (!d || !d.feature || d.feature.id !== F.id) return;
  const acts = d.feature.acts, m = Math.max(1e-9, F.page && F.page.max ? F.page.max : Math.max(...acts));
  d.tokens.forEach((t, i) => {
    const a = acts[i];
    const chip = el("span", { class: "chip" + (i === F.pin ? " selected" : ""), "data-i": i,
      title: `#${i} · f${featName(F.id)} = ${a.toFixed(4)}` }, show(t.text));
    if (a > 0) shade(chip, a, m);
    chip.addEventListener("mouseenter", () => drawTokenTop(i));
    chip.addEventListener("mouseleave", () => drawTokenTop(F.pin));
    chip.addEventListener("click", () => { F.pin = F.pin === i ? null : i; drawFeatChips(); drawTokenTop(F.pin); });
    box.append(chip);
  });
}

function drawTokenTop(i) {
  const box = $("feat-token-top"), d = F.toks;
  box.textContent = "";
  if (i === null || !d) { $("feat-token-where").textContent = "hover or click a token"; return; }
  $("feat-token-where").textContent = `at #${i} “${show(d.tokens[i].text)}”`;
  const rows = d.top[i], m = Math.max(1e-9, ...rows.map((r) => r[1]));
  if (!rows.length) box.append(el("span", { class: "muted small" }, "no latent active here"));
  for (const [id, v] of rows) {
    box.append(
      el("span", { class: "label clickable" + (id === F.id ? " chosen" : ""), onclick: () => openFeature(id) }, "#" + featName(id)),
      el("span", { class: "track", onclick: () => openFeature(id) },
        el("span", { class: "fill", style: `width:${(100 * v / m).toFixed(1)}%;background:var(--orange)` })),
      el("span", { class: "num" }, fmt(v)));
  }
}

// ---- steering --------------------------------------------------------------------------
let steerTimer = null;
function scheduleSteer() { clearTimeout(steerTimer); steerTimer = setTimeout(featRun, 150); }

function drawEq() {
  const mode = $("feat-mode").value, value = +$("feat-value").value;
  $("feat-value-out").textContent = fmt(value);
  const c = F.info.clt, n = featName(F.id);
  if (c) {
    const l = Math.floor(F.id / c.d_sae);
    $("feat-eq").textContent = mode === "add"
      ? `f${n} ← f${n} + ${fmt(value)} at every position; each MLP output t ≥ ${l} gains ${fmt(value)} · W_dec[${n} → t]`
      : `f${n} ← ${fmt(value)} at every position; each MLP output t ≥ ${l} gains (${fmt(value)} − f${n}) · W_dec[${n} → t]  (the CLT's error kept)`;
    return;
  }
  $("feat-eq").textContent = mode === "add"
    ? `a ← a + ${fmt(value)} · W_dec[${F.id}]  at every position of ${F.info.out_hook || F.info.hook}`
    : `a ← a + (${fmt(value)} − f${F.id}(a)) · W_dec[${F.id}]  (the SAE's error term kept)`;
}

function drawSteer(d) {
  const box = $("feat-dist"); box.textContent = "";
  for (const r of d.rows) {
    box.append(
      el("span", { class: "label" }, show(r.text)),
      el("span", { class: "track" },
        el("span", { class: "ghost", style: `width:${(100 * r.clean).toFixed(2)}%` }),
        el("span", { class: "fill", style: `width:${(100 * r.p).toFixed(2)}%` }),
        el("span", { class: "tick", style: `left:${(100 * r.clean).toFixed(2)}%` })),
      el("span", { class: "num" }, `${(100 * r.p).toFixed(1)}% (was ${(100 * r.clean).toFixed(1)}%)`));
  }
  $("feat-kl").textContent = `KL(steered ‖ clean) = ${d.kl.toFixed(4)} nats`;
  $("feat-sample").textContent = d.sample;
  $("feat-clean-sample").textContent = d.clean_sample;
}

// ---- wiring ----------------------------------------------------------------------------
$("feat-query").addEventListener("input", () => { clearTimeout(searchTimer); searchTimer = setTimeout(featSearch, 200); });
$("feat-id").addEventListener("change", () => {
  const c = F.info.clt, i = +$("feat-id").value || 0;
  openFeature(c ? +$("feat-layer").value * c.d_sae + Math.max(0, Math.min(c.d_sae - 1, i)) : Math.max(0, Math.min(F.info.d_sae - 1, i)));
});
$("feat-prev").addEventListener("click", () => F.id > 0 && openFeature(F.id - 1));
$("feat-next").addEventListener("click", () => F.id < F.info.d_sae - 1 && openFeature(F.id + 1));
$("feat-prompt").addEventListener("input", () => { clearTimeout(steerTimer); steerTimer = setTimeout(featRun, 250); });
$("feat-value").addEventListener("input", scheduleSteer);
$("feat-mode").addEventListener("change", () => { if ($("feat-mode").value === "clamp" && +$("feat-value").value < 0) $("feat-value").value = 0; openFeature(F.id); });
for (const id of ["feat-max", "feat-temp", "feat-seed"]) $(id).addEventListener("change", featRun);
$("api-key").addEventListener("change", () => { if (!F.info) featuresBoot(); });
featuresBoot();
