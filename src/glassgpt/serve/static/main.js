// glassgpt explorer: wires the controls and starts the page. Loaded after app.js and the
// views' scripts, so every function it names is defined (features.js, after it, wires its own).
"use strict";

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
