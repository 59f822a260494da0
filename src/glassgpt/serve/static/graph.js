// glassgpt explorer, Graph view: an attribution graph (circuit-tracer's JSON, over
// /api/graph/*) drawn by layer (y) and token position (x), its nodes hovered, clicked, pinned,
// selected and grouped into supernodes, and its features edited in the model's real forward
// pass. Loaded after app.js and features.js, whose helpers ($, api, el, show, shade, fmt) it
// uses. The tab appears only when the server has transcoders or graph files.
"use strict";

const G = { info: null, g: null, nodes: new Map(), pinned: new Set(), sel: new Set(), supers: [],
  clicked: "", hover: "", pages: new Map(), seq: 0, traced: false, tipAt: [0, 0] };
const SVGNS = "http://www.w3.org/2000/svg";
const MAX_EDGES = 1500;  // the heaviest links drawn (the rest are faint noise at this size)
const ROW = 62, STEP = 15, PAD = 10;

function svg(tag, attrs = {}, ...kids) {
  const n = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
  for (const k of kids) n.append(k);
  return n;
}

const isFeature = (n) => n.feature_type.includes("transcoder");
const kindOf = (n) => isFeature(n) ? "feature" : n.feature_type === "mlp reconstruction error" ? "error"
  : n.feature_type === "embedding" ? "token" : "logit";
function featureKey(n) { const [l, i] = n.node_id.split("_"); return [+l, +i]; }  // {layer}_{index}_{pos}

async function graphBoot() {
  try { G.info = await api("/api/graph/info"); } catch (e) { return; }  // e.g. no API key yet
  if (!G.info.graphs) return;
  $("tab-graph").hidden = false;
  $("graph-trace").disabled = !G.info.transcoders;
  $("graph-source").textContent = G.info.transcoders
    ? `${G.info.kind} on layers ${G.info.layers.join(", ")}${G.info.pages.length ? " · feature pages" : ""}`
    : "no transcoders: open or upload a graph (tracing and interventions need serve --transcoders)";
  const sel = $("graph-files");
  sel.textContent = "";
  sel.append(el("option", { value: "" }, G.info.files.length ? "open a graph file…" : "no graph files (serve --graph)"));
  for (const f of G.info.files) sel.append(el("option", { value: f }, f));
  if (!$("graph-prompt").value) $("graph-prompt").value = $("prompt").value || "the cat sat on the";
  const h = new URLSearchParams(location.hash.slice(1));
  if (h.has("graph")) { setView("graph"); await fromHash(h); }
}

// ---- getting a graph -------------------------------------------------------------------
async function withStatus(work) {
  const seq = ++G.seq;
  $("graph-status").textContent = "working…"; $("graph-status").classList.remove("error");
  try {
    const d = await work();
    if (seq === G.seq) { $("graph-status").textContent = ""; present(d); }
    return d;
  } catch (e) {
    if (seq === G.seq) { $("graph-status").textContent = e.message; $("graph-status").classList.add("error"); }
    return null;
  }
}

function traceBody() {
  return { prompt: $("graph-prompt").value, node_threshold: +$("graph-node-t").value,
    edge_threshold: +$("graph-edge-t").value, max_feature_nodes: +$("graph-max").value || 512 };
}
const trace = () => withStatus(() => api("/api/graph/trace", traceBody()));
const openFile = (name) => withStatus(() => api(`/api/graph/open?name=${encodeURIComponent(name)}`));
const upload = (doc) => withStatus(() => api("/api/graph/upload", { doc }));

function present(d) {  // a graph arrived: its view state from its qParams, then drawn
  G.g = d; G.nodes = new Map(d.doc.nodes.map((n) => [n.node_id, n]));
  const q = d.doc.qParams || {};
  const ids = (xs) => (Array.isArray(xs) ? xs : String(xs || "").split(",")).filter((x) => G.nodes.has(x));
  G.pinned = new Set(ids(q.pinnedIds)); G.sel = new Set(); G.clicked = G.nodes.has(q.clickedId) ? q.clickedId : "";
  G.supers = (q.supernodes || []).map((s) => ({ name: String(s[0]), ids: ids(s.slice(1)) })).filter((s) => s.ids.length);
  const m = d.doc.metadata;
  const sc = d.scores ? ` · replacement score ${d.scores.replacement.toFixed(3)} · completeness ${d.scores.completeness.toFixed(3)}` +
    ` · ${d.active_features} active features` : "";
  $("graph-title").textContent = `${d.name} · “${m.prompt}”`;
  $("graph-stats").textContent = `${d.doc.nodes.length} nodes · ${d.doc.links.length} edges${sc}`;
  drawGraph(); drawSide(); drawSelected(); saveHash();
  $("graph-dist").textContent = ""; $("graph-kl").textContent = "";
  $("graph-sample").textContent = ""; $("graph-clean-sample").textContent = "";
}

// ---- the drawing ----------------------------------------------------------------------
const stepOf = (n) => (kindOf(n) === "logit" ? 26 : STEP);  // a logit's label needs room

function layout() {
  const d = G.g.doc, L = G.info.n_layers, T = d.metadata.prompt_tokens.length;
  const rowOf = (n) => { const k = kindOf(n); return k === "token" ? 0 : k === "logit" ? L + 1 : +n.layer + 1; };
  const cells = new Map();  // "row/pos" → nodes, the most influential first
  for (const n of d.nodes) {
    const key = `${rowOf(n)}/${n.ctx_idx}`;
    if (!cells.has(key)) cells.set(key, []);
    cells.get(key).push(n);
  }
  // a column: as wide as its token's label, or its widest cell of nodes
  const widths = d.metadata.prompt_tokens.map((t) => Math.max(30, 8 * [...show(t)].length + 14));
  for (const [key, ns] of cells) {
    ns.sort((a, b) => (kindOf(a) === "error") - (kindOf(b) === "error") || (a.influence ?? 1) - (b.influence ?? 1));
    const pos = +key.split("/")[1];
    widths[pos] = Math.max(widths[pos], ns.length * stepOf(ns[0]) + 2 * PAD);
  }
  const left = 58, top = 84, xs = [];
  let x = left;
  for (const w of widths) { xs.push(x); x += w; }
  const where = new Map();
  for (const [key, ns] of cells) {
    const [row, pos] = key.split("/").map(Number);
    const step = stepOf(ns[0]), span = (ns.length - 1) * step, cx = xs[pos] + widths[pos] / 2;
    ns.forEach((n, k) => where.set(n.node_id, { x: cx - span / 2 + k * step, y: top + (L + 1 - row) * ROW }));
  }
  return { where, xs, widths, width: x + 20, height: top + (L + 1) * ROW + 58, top, left, L, T };
}

function drawGraph() {
  const box = $("graph-svg"); box.textContent = "";
  if (!G.g) return;
  const lay = layout(), { where, xs, widths, L, T, top, left } = lay;
  box.setAttribute("width", lay.width); box.setAttribute("height", lay.height);
  box.setAttribute("viewBox", `0 0 ${lay.width} ${lay.height}`);
  const d = G.g.doc;
  // rows: layer names on the left, faint bands
  for (let r = 0; r <= L + 1; r++) {
    const y = top + (L + 1 - r) * ROW;
    box.append(svg("line", { x1: left - 6, x2: lay.width - 10, y1: y, y2: y, class: "band" }));
    box.append(svg("text", { x: 6, y: y + 4, class: "axis" }, r === 0 ? "tokens" : r === L + 1 ? "logits" : `L${r - 1}`));
  }
  // the prompt's tokens along the bottom, one column each
  d.metadata.prompt_tokens.forEach((t, p) => {
    const x = xs[p] + widths[p] / 2, y = top + (L + 1) * ROW + 28;
    box.append(svg("text", { x, y, class: "tok", "text-anchor": "middle" }, show(t)));
    box.append(svg("text", { x, y: y + 15, class: "axis", "text-anchor": "middle" }, String(p)));
  });
  // edges, heaviest last (on top)
  const links = [...d.links].sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight)).slice(0, MAX_EDGES).reverse();
  const wmax = Math.max(1e-12, ...links.map((l) => Math.abs(l.weight)));
  const edges = svg("g", { class: "edges" });
  for (const l of links) {
    const a = where.get(l.source), b = where.get(l.target);
    if (!a || !b) continue;
    const f = Math.abs(l.weight) / wmax, my = (a.y + b.y) / 2;
    edges.append(svg("path", { d: `M${a.x},${a.y} C${a.x},${my} ${b.x},${my} ${b.x},${b.y}`,
      class: "edge " + (l.weight >= 0 ? "pos" : "neg"), "data-s": l.source, "data-t": l.target,
      "stroke-width": (0.4 + 3.6 * f).toFixed(2), "stroke-opacity": (0.12 + 0.7 * f).toFixed(3) }));
  }
  box.append(edges);
  // supernodes: a labelled box around their members
  for (const s of G.supers) {
    const ps = s.ids.map((i) => where.get(i)).filter(Boolean);
    if (!ps.length) continue;
    const x0 = Math.min(...ps.map((p) => p.x)) - 9, x1 = Math.max(...ps.map((p) => p.x)) + 9;
    const y0 = Math.min(...ps.map((p) => p.y)) - 9, y1 = Math.max(...ps.map((p) => p.y)) + 9;
    box.append(svg("rect", { x: x0, y: y0, width: x1 - x0, height: y1 - y0, rx: 7, class: "super" }));
    box.append(svg("text", { x: x0 + 2, y: y0 - 3, class: "super-name" }, s.name));
  }
  // nodes
  const nodes = svg("g", { class: "nodes" });
  for (const n of d.nodes) {
    const p = where.get(n.node_id), k = kindOf(n);
    const cls = `node ${k}` + (G.pinned.has(n.node_id) ? " pinned" : "") + (G.sel.has(n.node_id) ? " selected" : "") +
      (G.clicked === n.node_id ? " clicked" : "");
    const shape = k === "feature" ? svg("circle", { cx: p.x, cy: p.y, r: 5.5 })
      : k === "error" ? svg("rect", { x: p.x - 4.5, y: p.y - 4.5, width: 9, height: 9 })
      : k === "token" ? svg("rect", { x: p.x - 6, y: p.y - 5, width: 12, height: 10, rx: 3 })
      : svg("path", { d: `M${p.x},${p.y - 7} L${p.x + 7},${p.y} L${p.x},${p.y + 7} L${p.x - 7},${p.y} Z` });
    const g = svg("g", { class: cls, "data-id": n.node_id }, shape);
    if (k === "logit") {  // the output token and its probability, above
      const m = /Output "(.*)" \(p=([\d.]+)\)/.exec(n.clerp || "");
      const txt = m ? `${m[1]} ${(+m[2]).toFixed(2)}` : n.node_id;
      g.append(svg("text", { x: p.x + 3, y: p.y - 11, class: "logit-label", transform: `rotate(-55 ${p.x + 3} ${p.y - 11})` }, txt));
    }
    g.addEventListener("mouseenter", (ev) => hoverNode(n.node_id, ev));
    g.addEventListener("mouseleave", () => hoverNode("", null));
    g.addEventListener("click", (ev) => (ev.shiftKey || ev.ctrlKey || ev.metaKey) ? toggleSel(n.node_id) : clickNode(n.node_id));
    nodes.append(g);
  }
  box.append(nodes);
  focus(G.hover || G.clicked);
}

function focus(id) {  // one node's edges drawn strong, the rest faded
  const box = $("graph-svg");
  box.classList.toggle("focus", !!id);
  for (const e of box.querySelectorAll(".edge")) e.classList.toggle("hot", !!id && (e.dataset.s === id || e.dataset.t === id));
}

function describe(n) {
  const k = kindOf(n), tok = G.g.doc.metadata.prompt_tokens[n.ctx_idx];
  if (k === "feature") { const [l, i] = featureKey(n); return `feature L${l} #${i} at “${show(tok)}” (${n.ctx_idx})`; }
  if (k === "error") return `MLP error, layer ${n.layer} at “${show(tok)}” (${n.ctx_idx})`;
  if (k === "token") return `token “${show(tok)}” (${n.ctx_idx})`;
  return n.clerp || n.node_id;
}

async function featureInfo(n) {  // label and page of a feature node (cached; null without transcoders)
  if (!G.info.transcoders) return null;
  const [l, i] = featureKey(n), key = `${l}/${i}`;
  if (!G.pages.has(key)) G.pages.set(key, api(`/api/graph/feature/${l}/${i}`).catch(() => null));
  return G.pages.get(key);
}

async function hoverNode(id, ev) {
  G.hover = id; focus(id || G.clicked);
  const seq = G.tipSeq = (G.tipSeq || 0) + 1;  // a second hover of the same node while the first waits: one tip
  const tip = $("graph-tip");
  if (!id) { tip.hidden = true; return; }
  const n = G.nodes.get(id), wrap = $("graph-wrap").getBoundingClientRect();
  tip.textContent = "";
  tip.append(el("b", {}, describe(n)));
  if (n.clerp && kindOf(n) !== "logit") tip.append(el("div", { class: "lab" }, n.clerp));
  const nums = [];
  if (n.activation !== null && n.activation !== undefined) nums.push(`activation ${fmt(n.activation)}`);
  if (n.influence !== null && n.influence !== undefined) nums.push(`cumulative influence ${n.influence.toFixed(3)}`);
  if (nums.length) tip.append(el("div", { class: "muted" }, nums.join(" · ")));
  G.tipAt = [ev.clientX - wrap.left, ev.clientY - wrap.top];
  tip.hidden = false;
  place(tip);
  if (isFeature(n)) {
    const f = await featureInfo(n);
    if (G.hover !== id || G.tipSeq !== seq || !f) return;
    if (f.label && !n.clerp) tip.append(el("div", { class: "lab" }, f.label));
    if (f.page) {
      if (f.page.decoder_norms) tip.append(el("div", { class: "muted" }, "writes ‖W_dec‖: " +
        f.page.decoder_norms.map((r) => `L${r.layer} ${fmt(r.norm)}`).join(" · ")));
      tip.append(el("div", { class: "muted" }, "top activations:"));
      for (const c of f.page.contexts.slice(0, 3)) tip.append(contextLine(c, f.page.max));
    }
    place(tip);
  }
}

function place(tip) {  // below right of the pointer, flipped left or up where the card would clip it
  const w = $("graph-wrap"), [x, y] = G.tipAt;
  const left = x + 14 + tip.offsetWidth > w.clientWidth ? Math.max(0, x - 14 - tip.offsetWidth) : x + 14;
  const top = y + 14 + tip.offsetHeight > w.clientHeight ? Math.max(0, y - 14 - tip.offsetHeight) : y + 14;
  tip.style.left = `${left + w.scrollLeft}px`; tip.style.top = `${top + w.scrollTop}px`;
}

function contextLine(c, m) {
  const line = el("div", { class: "ctx" });
  c.tokens.forEach((t, j) => {
    const s = el("span", { class: "ct" + (j === c.at ? " at" : "") }, show(t));
    if (c.acts[j] > 0) shade(s, c.acts[j], m || 1);
    line.append(s);
  });
  return line;
}

function clickNode(id) { G.clicked = G.clicked === id ? "" : id; drawGraph(); drawSide(); saveHash(); }
function toggleSel(id) {
  if (!isFeature(G.nodes.get(id))) return;
  G.sel.has(id) ? G.sel.delete(id) : G.sel.add(id);
  drawGraph(); drawSelected(); drawSide(); saveHash();
}

// ---- the side panel: the clicked node, its page, pins and supernodes -------------------
async function drawSide() {
  const box = $("graph-node"); box.textContent = "";
  const id = G.clicked, n = G.nodes.get(id);
  $("graph-node-title").textContent = n ? describe(n) : "click a node";
  if (n) {
    const bar = el("div", { class: "controls row" },
      el("button", { id: "graph-pin", onclick: () => { G.pinned.has(id) ? G.pinned.delete(id) : G.pinned.add(id); drawGraph(); drawSide(); saveHash(); } },
        G.pinned.has(id) ? "unpin" : "pin"));
    if (isFeature(n)) bar.append(el("button", { id: "graph-select-one", onclick: () => toggleSel(id) }, G.sel.has(id) ? "deselect" : "select for an edit"));
    box.append(bar);
    if (n.clerp && kindOf(n) !== "logit") box.append(el("p", { class: "lab" }, n.clerp));
    const ins = G.g.doc.links.filter((l) => l.target === id).sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight)).slice(0, 5);
    const outs = G.g.doc.links.filter((l) => l.source === id).sort((a, b) => Math.abs(b.weight) - Math.abs(a.weight)).slice(0, 5);
    for (const [title, ls, end] of [["strongest inputs", ins, "source"], ["strongest outputs", outs, "target"]]) {
      if (!ls.length) continue;
      const t = el("table", { class: "pairs" }, el("caption", {}, title));
      for (const l of ls) t.append(el("tr", { class: "clickable", onclick: () => clickNode(l[end]) },
        el("td", { class: "t" }, describe(G.nodes.get(l[end]))), el("td", { class: "v " + (l.weight >= 0 ? "pos" : "neg") }, fmt(l.weight))));
      box.append(t);
    }
    if (isFeature(n)) {
      const page = el("div", { id: "graph-page" }, el("span", { class: "muted small" }, "loading its page…"));
      box.append(page);
      const f = await featureInfo(n);
      if (G.clicked !== id) return;
      page.textContent = "";
      if (!f) page.append(el("span", { class: "muted small" }, "no transcoders on this server: no page"));
      else if (!f.page) page.append(el("span", { class: "muted small" }, `feature L${f.layer} #${f.feature}: no page (glassgpt sae features on its transcoder)`));
      else drawFeaturePage(page, f);
    }
  }
  drawLists();
}

function drawFeaturePage(box, f) {  // the Features tab's page of this feature, compact
  const p = f.page;
  box.append(el("h3", {}, `Feature L${f.layer} #${f.feature}`, el("span", { class: "muted small" },
    ` density ${(100 * p.density).toFixed(3)}% · max ${fmt(p.max)}${f.detection !== null && f.detection !== undefined ? ` · detection ${f.detection.toFixed(2)}` : ""}`)));
  const lg = el("div", { class: "two" });
  for (const [title, rows, cls] of [["promotes", p.logit_top, "pos"], ["suppresses", p.logit_bottom, "neg"]]) {
    const t = el("table", { class: "pairs" }, el("caption", {}, title));
    for (const r of rows.slice(0, 5)) t.append(el("tr", {}, el("td", { class: "t" }, show(r.text)), el("td", { class: "v " + cls }, r.value.toFixed(3))));
    lg.append(t);
  }
  box.append(lg);
  if (p.decoder_norms) box.append(decoderNorms(p.decoder_norms));
  box.append(el("h3", {}, "Top activations"));
  const ctx = el("div", { class: "contexts" });
  for (const c of p.contexts.slice(0, 8)) ctx.append(el("span", { class: "cv" }, fmt(c.value)), contextLine(c, p.max));
  box.append(ctx);
}

function decoderNorms(rows) {  // a CLT feature's writes: ‖W_dec‖ per target layer, as bars
  const top = Math.max(...rows.map((r) => r.norm), 1e-12);
  const t = el("table", { class: "pairs norms" }, el("caption", {}, "decoder norm per target layer"));
  for (const r of rows) t.append(el("tr", {}, el("td", { class: "t" }, `L${r.layer}`),
    el("td", {}, el("span", { class: "bar", style: `display:inline-block;height:8px;background:#4a7bd0;width:${(60 * r.norm / top).toFixed(1)}px` })),
    el("td", { class: "v" }, fmt(r.norm))));
  return t;
}

function drawLists() {
  const pins = $("graph-pins"); pins.textContent = "";
  for (const id of G.pinned) pins.append(el("button", { class: "pill pin", onclick: () => clickNode(id) }, short(id)));
  if (!G.pinned.size) pins.append(el("span", { class: "muted small" }, "none: click a node, then pin"));
  const sup = $("graph-supers"); sup.textContent = "";
  G.supers.forEach((s, k) => sup.append(el("span", { class: "pill super" }, `${s.name} (${s.ids.length})`,
    el("button", { class: "x", title: "ungroup", onclick: () => { G.supers.splice(k, 1); drawGraph(); drawLists(); saveHash(); } }, "×"))));
  if (!G.supers.length) sup.append(el("span", { class: "muted small" }, "none: select nodes (shift-click), name them, group"));
}

function short(id) { const n = G.nodes.get(id); return n ? describe(n).replace(/ \(\d+\)$/, "") : id; }

function group() {
  const name = $("graph-super-name").value.trim() || `group ${G.supers.length + 1}`;
  if (!G.sel.size) { $("graph-status").textContent = "select nodes first (shift-click them)"; return; }
  G.supers.push({ name, ids: [...G.sel] });
  $("graph-super-name").value = "";
  drawGraph(); drawLists(); saveHash();
}

// ---- the view as a URL and as a file ----------------------------------------------------
function qParams() {
  return { pinnedIds: [...G.pinned], supernodes: G.supers.map((s) => [s.name, ...s.ids]), linkType: "both",
    clickedId: G.clicked, sg_pos: "" };
}

function saveHash() {
  if (!G.g) return;
  const h = new URLSearchParams({ graph: G.g.name });
  if (G.g.name.startsWith("trace-")) h.set("prompt", G.g.doc.metadata.prompt);
  if (G.pinned.size) h.set("pinned", [...G.pinned].join(","));
  if (G.sel.size) h.set("sel", [...G.sel].join(","));
  if (G.clicked) h.set("clicked", G.clicked);
  if (G.supers.length) h.set("supernodes", JSON.stringify(qParams().supernodes));
  history.replaceState(null, "", "#" + h.toString());
}

async function fromHash(h) {
  const name = h.get("graph");
  let d = await openFile(name);
  if (!d && h.has("prompt") && G.info.transcoders) {  // a trace of another server's life: trace it again
    $("graph-prompt").value = h.get("prompt");
    d = await trace();
  }
  if (!d) return;
  const ids = (s) => (s || "").split(",").filter((x) => G.nodes.has(x));
  G.pinned = new Set(ids(h.get("pinned"))); G.sel = new Set(ids(h.get("sel")));
  G.clicked = G.nodes.has(h.get("clicked")) ? h.get("clicked") : "";
  try { G.supers = JSON.parse(h.get("supernodes") || "[]").map((s) => ({ name: s[0], ids: s.slice(1).filter((x) => G.nodes.has(x)) })); }
  catch (e) { G.supers = []; }
  drawGraph(); drawSide(); drawSelected(); saveHash();
}

function download() {
  if (!G.g) return;
  const doc = { ...G.g.doc, qParams: qParams() };
  const a = el("a", { href: URL.createObjectURL(new Blob([JSON.stringify(doc)], { type: "application/json" })),
    download: `${G.g.doc.metadata.slug || G.g.name}.json` });
  document.body.append(a); a.click(); a.remove();
}

// ---- interventions ---------------------------------------------------------------------
function drawSelected() {
  const box = $("graph-selected"); box.textContent = "";
  for (const id of G.sel) box.append(el("span", { class: "pill sel" }, short(id),
    el("button", { class: "x", title: "deselect", onclick: () => toggleSel(id) }, "×")));
  if (!G.sel.size) box.append(el("span", { class: "muted small" }, "shift-click feature nodes (or click one and “select for an edit”)"));
  $("graph-run").disabled = !G.sel.size || !G.info.transcoders;
  const mode = $("graph-mode").value, v = $("graph-value").value;
  $("graph-value").disabled = mode === "zero";
  $("graph-eq").textContent = G.sel.size ? `a' = ${mode === "zero" ? "0" : mode === "scale" ? `${v} · a` : v}` +
    ` at each selected (layer, position, feature); mlp_out += (a' − a) W_dec in every layer the feature writes` : "";
}

async function intervene() {
  const mode = $("graph-mode").value, value = +$("graph-value").value;
  const body = { graph: G.g.name, edits: [...G.sel].map((node) => ({ node, mode, value })),
    max_tokens: +$("graph-max-tokens").value || 0, temperature: +$("graph-temp").value, seed: +$("graph-seed").value };
  $("graph-edit-status").textContent = "running…"; $("graph-edit-status").classList.remove("error");
  try {
    const d = await api("/api/graph/intervene", body);
    $("graph-edit-status").textContent = "";
    drawBars(d);
  } catch (e) { $("graph-edit-status").textContent = e.message; $("graph-edit-status").classList.add("error"); }
}

function drawBars(d) {
  const box = $("graph-dist"); box.textContent = "";
  box.dataset.runs = +(box.dataset.runs || 0) + 1;  // (how many answers were drawn)
  const m = Math.max(1e-9, ...d.rows.map((r) => Math.max(r.p, r.clean)));  // bars on the scale of the largest
  $("graph-scale").textContent = `bars: edited; faint bars and ticks: clean; full width = ${(100 * m).toFixed(1)}%`;
  for (const r of d.rows) {
    box.append(
      el("span", { class: "label" }, show(r.text)),
      el("span", { class: "track" },
        el("span", { class: "ghost", style: `width:${(100 * r.clean / m).toFixed(2)}%` }),
        el("span", { class: "fill", style: `width:${(100 * r.p / m).toFixed(2)}%` }),
        el("span", { class: "tick", style: `left:${(100 * r.clean / m).toFixed(2)}%` })),
      el("span", { class: "num" }, `${(100 * r.p).toFixed(1)}% (was ${(100 * r.clean).toFixed(1)}%)`));
  }
  $("graph-kl").textContent = `KL(edited ‖ clean) = ${d.kl.toFixed(4)} nats`;
  $("graph-sample").textContent = d.sample; $("graph-clean-sample").textContent = d.clean_sample;
}

// ---- wiring ----------------------------------------------------------------------------
$("graph-trace").addEventListener("click", trace);
$("graph-prompt").addEventListener("keydown", (ev) => { if (ev.key === "Enter" && ev.ctrlKey) { ev.preventDefault(); trace(); } });
$("graph-files").addEventListener("change", () => $("graph-files").value && openFile($("graph-files").value));
$("graph-upload").addEventListener("change", async () => {
  const f = $("graph-upload").files[0];
  if (!f) return;
  try { await upload(JSON.parse(await f.text())); } catch (e) { $("graph-status").textContent = `${f.name}: ${e.message}`; $("graph-status").classList.add("error"); }
  $("graph-upload").value = "";
});
$("graph-download").addEventListener("click", download);
$("graph-group").addEventListener("click", group);
$("graph-run").addEventListener("click", intervene);
for (const id of ["graph-mode", "graph-value"]) $(id).addEventListener("input", drawSelected);
$("tab-graph").addEventListener("click", () => {  // the first visit traces the prompt shown
  if (!G.g && !G.traced && G.info && G.info.transcoders) { G.traced = true; trace(); }
});
$("api-key").addEventListener("change", () => { if (!G.info) graphBoot(); });
graphBoot();
