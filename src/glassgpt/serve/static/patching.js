// glassgpt explorer, Patching tab: activation patching over /api/patch and /api/patch/effect.
// Uses app.js's helpers.
"use strict";

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
