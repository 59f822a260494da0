"""A CLT folder with the model it reads: its feature pages (``glassgpt sae features``) and its
export in circuit-tracer's CLT format (``glassgpt sae export --format circuit-tracer``).

Pages: feature i of layer l is latent l · d_sae + i of glassgpt.features.pages, its
activation a_l,i read from u_l on the corpus, its logit effect that of its summed writes
Σ_{t ≥ l} W_dec[l][t − l][i] (the direct path, as an SAE latent's), and ``decoder_norms``
‖W_dec[l][t − l][i]‖ per target layer t.

circuit-tracer (``circuit_tracer.transcoder.cross_layer_transcoder.load_clt``) reads a folder
of, per layer l, ``W_enc_l.safetensors`` {W_enc_l [d_sae, d_model] (its W_enc is x W_encᵀ),
b_enc_l, b_dec_l, threshold_l (JumpReLU: a = z · 1[z > θ], as ours)} and
``W_dec_l.safetensors`` {W_dec_l [d_sae, L − l, d_model]}. It has no TopK CLT: a topk CLT is
refused. Its hooks are TransformerLens's: the features read ``hook_resid_mid`` through the
model's ln2, as glassgpt's ``blocks.l.mlp.in`` does.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as st_save
from torch import Tensor

from glassgpt.checkpoint import open_run
from glassgpt.devices import parse_device
from glassgpt.errors import GlassError
from glassgpt.features.clt import CLT, clt_folder
from glassgpt.features.clt import CONFIG_FILE as CLT_FILE
from glassgpt.features.clt_train import check_clt, evaluate_clt, read_layers
from glassgpt.features.folders import _free, eval_stream, page_windows
from glassgpt.features.identity import check_identity
from glassgpt.features.metrics import EVAL_TOKENS, eval_window, measure
from glassgpt.features.pages import (
    FILE,
    Binning,
    FeaturePages,
    TopContexts,
    logit_effect_of,
    save_pages,
)
from glassgpt.model import GPT
from glassgpt.storage import atomic_write


def is_clt(path: str | Path) -> bool:
    """Whether ``path`` (or its ``clt/``) holds a CLT."""
    return (clt_folder(path) / CLT_FILE).is_file()


@torch.no_grad()
def compute_clt_pages(
    model: GPT,
    clt: CLT,
    batches: Iterable[tuple[Tensor, Tensor]],
    *,
    top: int = 20,
    before: int = 12,
    after: int = 4,
    logits: int = 10,
    meta: dict[str, Any] | None = None,
) -> FeaturePages:
    """The pages of every feature of every layer over ``batches`` of (windows, offsets)."""
    check_clt(clt, model)
    clt = clt.eval()
    L, S = clt.cfg.n_layers, clt.cfg.d_sae
    device = next(model.parameters()).device
    acc = TopContexts(L * S, top=top, before=before, after=after, binning=Binning())
    offset = (torch.arange(L, device=device) * S)[:, None]  # layer l's latents start at l·S
    for tokens, where in batches:
        u, _ = read_layers(model, tokens.to(device))
        if clt.cfg.arch == "topk":  # only the k per (token, layer) travel
            assert clt.cfg.k is not None
            values, index = clt.pre_acts(u).topk(clt.cfg.k, dim=-1)  # [B, T, L, k]
            acc.add_sparse(tokens, values.relu().flatten(-2), (index + offset).flatten(-2), where)
        else:
            acc.add(tokens, clt.encode(u).flatten(-2), where)
    if acc.tokens == 0:
        raise GlassError("no tokens to compute feature pages on (the data is empty)")
    writes = torch.cat([W.detach().sum(0) for W in clt.W_dec])  # [L·S, d_model]
    norms = torch.zeros(L * S, L)
    for l, W in enumerate(clt.W_dec):  # [L − l, S, d_model]
        norms[l * S : (l + 1) * S, l:] = W.detach().float().norm(dim=-1).T.cpu()
    info = {"clt": {"n_layers": L, "d_sae": S, "arch": clt.cfg.arch}, "hook": "blocks.*.mlp.in"}
    pages = acc.pages(logit_effect_of(model, writes, L * S, logits), {**(meta or {}), **info})
    pages.decoder_norms = norms
    return pages


def open_clt(folder: str, *, model: str | None = None, device: str = "cpu") -> tuple[CLT, GPT, Any, dict[str, Any]]:  # fmt: skip
    """(CLT, its model (``model``, else the one clt.json names), tokenizer, clt.json); one
    line when the model does not fit or is not the one it was trained on."""
    where = parse_device(device)
    clt = CLT.load(folder, device=where)
    doc = json.loads((clt_folder(folder) / CLT_FILE).read_text(encoding="utf-8"))
    model_path = model or doc.get("model")
    if not model_path:
        raise GlassError(f"{folder}: names no model; pass --model DIR")
    run = open_run(model_path, device=where)
    if run.tokenizer is None:
        warnings.warn(f"{model_path}: no tokenizer found; working with token ids only", stacklevel=2)  # fmt: skip
    assert run.model is not None
    check_clt(clt, run.model)
    check_identity(folder, doc, run, what="-c", hint="use the model it was trained on, or train a CLT on this one")  # fmt: skip
    return clt, run.model, run.tokenizer, doc


def eval_clt(
    folder: str, *, model: str | None = None, data: Sequence[str] | None = None,
    tokens: int = EVAL_TOKENS, seq_len: int | None = None, device: str = "cpu",
) -> dict[str, Any]:  # fmt: skip
    """The metrics of :func:`glassgpt.features.clt_train.evaluate_clt` (per-layer FVU and L0,
    CE loss recovered with every MLP output spliced) for the CLT in ``folder``, on ``data``
    (default: its data folder's val split, else train), as ``sae eval`` measures an SAE."""
    if tokens < 1:
        raise GlassError(f"--tokens: must be ≥ 1, got {tokens}")
    clt, net, tok, doc = open_clt(folder, model=model, device=device)
    T = eval_window(net.config.n_ctx, seq_len)
    stream, source = eval_stream(folder, data, doc.get("data"), tok, str(model or doc["model"]), T)
    with torch.no_grad():
        result = measure(net, clt.eval(), stream, seq_len=T, tokens=tokens, device=parse_device(device), how=evaluate_clt)  # fmt: skip
    return {**result, "source": source, "hook": "blocks.*.mlp.in", "arch": f"clt-{clt.cfg.arch}"}


def write_clt_pages(
    folder: str, *, model: str | None = None, top: int = 20, context: tuple[int, int] = (12, 4),
    device: str = "cpu", output: str | None = None, **corpus: Any,
) -> tuple[Path, FeaturePages]:  # fmt: skip
    """Compute and write the pages of the CLT in ``folder`` (default file:
    ``CLT_DIR/features.safetensors``): (the file, the pages). ``corpus``: ``data``, ``split``,
    ``tokens``, ``seq_len``, ``batch``, as glassgpt.features.folders.write_pages takes them."""
    clt, net, tok, doc = open_clt(folder, model=model, device=device)
    batches, meta = page_windows(folder, net, tok, doc, model=model, **corpus)
    pages = compute_clt_pages(net, clt, batches, top=top, before=context[0], after=context[1], meta=meta)  # fmt: skip
    out = Path(output) if output else clt_folder(folder) / FILE
    return save_pages(out, pages), pages


def export_circuit_tracer(folder: str, out: str, *, overwrite: bool = False) -> Path:
    """Write the CLT in ``folder`` to ``out`` in circuit-tracer's format (module docstring)."""
    path = Path(out)
    _free(path, overwrite)
    clt = CLT.load(folder)
    if clt.cfg.arch != "jumprelu":
        raise GlassError(f"-c {folder}: a {clt.cfg.arch} CLT; circuit-tracer's CLTs are JumpReLU (or ReLU) only")  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    theta = clt.theta.detach()
    for l in range(clt.cfg.n_layers):
        enc = {f"W_enc_{l}": clt.W_enc[l].detach().T, f"b_enc_{l}": clt.b_enc[l].detach(),
               f"b_dec_{l}": clt.b_dec[l].detach(), f"threshold_{l}": theta[l]}  # fmt: skip
        dec = {f"W_dec_{l}": clt.W_dec[l].detach().transpose(0, 1)}  # [S, L − l, d_model]
        for name, tensors in ((f"W_enc_{l}", enc), (f"W_dec_{l}", dec)):
            data = {k: v.float().contiguous() for k, v in tensors.items()}
            atomic_write(path / f"{name}.safetensors", st_save(data))
    return path
