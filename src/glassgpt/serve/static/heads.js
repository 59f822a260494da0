// glassgpt explorer, Explore tab's heads: the attention grid with its ablation buttons, the
// enlarged head, head scores and the selected head's circuits. Uses app.js's state and helpers.
"use strict";

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

// ---- head scores, circuits -------------------------------------------------------------
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
