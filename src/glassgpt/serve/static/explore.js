// glassgpt explorer, Explore tab: the token chips, the next-token distribution, direct logit
// attribution, the logit lens and generation. Uses app.js's state (S) and helpers.
"use strict";

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

// ---- logit lens ------------------------------------------------------------------------
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
