"""SAELens's format (``cfg.json`` + ``sae_weights.safetensors``, as sae_lens 6.x writes them),
to and from glassgpt's SAE. Both compute

    z = (x − b_dec·a) W_enc + b_enc     a = cfg.apply_b_dec_to_input (0 for a transcoder)
    f = σ(z),   x̂ = f W_dec + b_dec

with the same W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_out], b_dec [d_out]; the
architectures correspond as

    SAELens "standard"              σ = ReLU               glassgpt relu
    SAELens "topk"                  σ = ReLU∘TopK_k        glassgpt topk
    SAELens "jumprelu"              σ = ReLU(z)·1[z > θ]   glassgpt jumprelu (θ = exp(log_threshold));
                                                           glassgpt batchtopk (its evaluation θ for
                                                           every latent, as SAELens saves its own)
    SAELens "transcoder"            ReLU, a = 0            glassgpt transcoder, relu
    SAELens "jumprelu_transcoder"   as jumprelu, a = 0     glassgpt transcoder, jumprelu or batchtopk
    SAELens "topk", a = 0, metadata.hook_name_out          glassgpt transcoder, topk (SAELens has no
                                                           topk transcoder class; its HookedSAETransformer
                                                           splices at hook_name_out)

Folded on import, exactly: ``apply_b_dec_to_input = false`` (b_enc ← b_enc + b_dec W_enc), and
``rescale_acts_by_decoder_norm`` (W_enc,:ᵢ ← W_enc,:ᵢ ‖W_dec,ᵢ‖, b_encᵢ ← b_encᵢ ‖W_dec,ᵢ‖,
W_dec,ᵢ ← W_dec,ᵢ / ‖W_dec,ᵢ‖). θ ≤ 0 is θ = 0 (ReLU(z)·1[z > θ] = ReLU(z) then).

Activations. SAELens names TransformerLens's hooks (``blocks.8.hook_resid_pre``); glassgpt's
model of a GPT-2 imported from HF computes HF's activations, and so does TransformerLens's
``from_pretrained_no_processing``. TransformerLens's default ``from_pretrained`` does not:

- it centres the weights that write the residual stream, so each residual-stream activation
  a (resid_pre/mid/post, attn_out, mlp_out, embeddings) is P a, P = I − 11ᵀ/d_model. An SAE
  trained so reads P x; folded with W_enc ← P W_enc, b_enc ← b_enc − b_dec (I − P) W_enc
  (P = Pᵀ), it reads glassgpt's x and gives the same f. Its x̂ stays centred: it differs from
  x by a vector c·1 per token, which every LayerNorm after it removes, so splicing it into
  the model changes nothing downstream (but an FVU against raw x counts that mean);
- it folds the value biases into b_O (after folding ln1's bias β₁ into them), so ``hook_z``
  is z − (b_V + β₁ W_V): b_dec ← b_dec + b_V + β₁ W_V folds it;
- ``ln2.hook_normalized`` (a transcoder's input) is n = (x − μ)/σ before the LayerNorm's
  weight γ and bias β in every mode, and glassgpt's ``mlp.in`` is u = γ ⊙ n + β: with the
  model, W_enc ← W_enc / γ (per row), b_enc ← b_enc − (β / γ) W_enc.

``processed`` (None: from the file) says whether the SAE read a processed model: the file's
``metadata.model_from_pretrained_kwargs.center_writing_weights`` (default true, as
TransformerLens's own default) when the file names the model it was trained on, else false.
glassgpt exports write ``{"center_writing_weights": false, "fold_value_biases": false}`` there,
so SAELens tells its users to load the model with ``from_pretrained_no_processing``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor

from glassgpt.errors import ConfigError, GlassError, InputFileError
from glassgpt.features.sae import SAE, SAEConfig
from glassgpt.features.sites import check_model
from glassgpt.sample.steering import canonical_hook
from glassgpt.storage import atomic_write

CFG_FILE, WEIGHTS_FILE = "cfg.json", "sae_weights.safetensors"
LAYOUT_VERSION = "6.0.0"  # the cfg.json layout written (sae_lens ≥ 6 reads it as its own)
ARCHITECTURES = ("standard", "topk", "jumprelu", "transcoder", "jumprelu_transcoder")
NO_PROCESSING = {"center_writing_weights": False, "fold_value_biases": False}
_DTYPES = {"float32": "float32", "torch.float32": "float32", "float64": "float64",
           "torch.float64": "float64", "bfloat16": "bfloat16", "torch.bfloat16": "bfloat16",
           "float16": "float32", "torch.float16": "float32"}  # fmt: skip
_RESID = re.compile(r"(embed|pos_embed|blocks\.\d+\.(resid_pre|resid_mid|resid_post|attn_out|mlp_out))")  # fmt: skip
_TL_NAMES = re.compile(r"blocks\.(\d+)\.(?:(attn|mlp)\.)?(resid_pre|resid_mid|resid_post|attn_out|mlp_out|q|k|v|z|result|post|pre)")  # fmt: skip
_TL_ALIASES = {r"blocks\.(\d+)\.hook_mlp_in": r"blocks.\1.resid_mid",
               r"blocks\.(\d+)\.hook_attn_in": r"blocks.\1.resid_pre",
               r"blocks\.(\d+)\.ln2\.hook_normalized": r"blocks.\1.mlp.in",
               r"blocks\.(\d+)\.mlp\.hook_pre": r"blocks.\1.mlp.pre"}  # fmt: skip


def is_saelens(folder: str | Path) -> bool:
    """Whether ``folder`` holds an SAE in SAELens's format."""
    return (Path(folder) / CFG_FILE).is_file() and (Path(folder) / WEIGHTS_FILE).is_file()


# -- hook names ----------------------------------------------------------------------------


def tl_hook(name: str) -> str:
    """TransformerLens's spelling of glassgpt's activation ``name`` (others unchanged).

    >>> tl_hook("blocks.8.resid_pre"), tl_hook("blocks.0.attn.z"), tl_hook("embed")
    ('blocks.8.hook_resid_pre', 'blocks.0.attn.hook_z', 'hook_embed')
    >>> tl_hook("blocks.2.mlp.in")
    'blocks.2.ln2.hook_normalized'
    """
    if name in ("embed", "pos_embed"):
        return f"hook_{name}"
    if m := re.fullmatch(r"blocks\.(\d+)\.mlp\.in", name):
        return f"blocks.{m.group(1)}.ln2.hook_normalized"
    m = _TL_NAMES.fullmatch(name)
    if m is None:
        return name
    layer, module, site = m.groups()
    return f"blocks.{layer}." + (f"{module}.hook_{site}" if module else f"hook_{site}")


def glassgpt_hook(name: str) -> str:
    """glassgpt's name of TransformerLens's hook ``name`` (``ln2.hook_normalized``: the MLP's
    input ``mlp.in``, up to the norm's weight and bias).

    >>> glassgpt_hook("blocks.8.hook_resid_pre"), glassgpt_hook("blocks.3.hook_mlp_in")
    ('blocks.8.resid_pre', 'blocks.3.resid_mid')
    """
    for pattern, repl in _TL_ALIASES.items():
        if re.fullmatch(pattern, name):
            return re.sub(pattern, repl, name)
    return canonical_hook(name)


# -- export ----------------------------------------------------------------------------------


def _ln2(model: Any, layer: int) -> tuple[Tensor, Tensor] | None:
    """(γ, β) of layer ``layer``'s MLP norm in float64 (β = 0 without a bias); None when the
    MLP reads resid_mid itself (post-norm)."""
    if model.config.norm_placement == "post":
        return None
    ln = model.blocks[layer].ln2
    gamma = ln.gain.detach().double().cpu()  # o + w (Gemma: 1 + w)
    beta = ln.b.detach().double().cpu() if ln.b is not None else torch.zeros_like(gamma)
    return gamma, beta


def _value_bias(model: Any, layer: int) -> Tensor:
    """The value bias TransformerLens folds away at ``layer``, [H·d_head]: b_V + β₁ W_V per head
    (fold_ln first moves ln1's bias β₁ into b_V)."""
    block = model.blocks[layer]
    attn = block.attn
    W_V = attn.W_V.detach().double().cpu()  # [H, d_model, d_head]
    b_V = attn.b_V.detach().double().cpu() if attn.b_V is not None else W_V.new_zeros(W_V.shape[0], W_V.shape[2])  # fmt: skip
    ln1 = block.ln1
    if model.config.norm_placement == "pre" and getattr(ln1, "b", None) is not None:
        b_V = b_V + torch.einsum("d,hde->he", ln1.b.detach().double().cpu(), W_V)
    return b_V.reshape(-1)


def _layer(hook: str) -> int:
    return int(hook.split(".")[1])


def to_saelens(sae: SAE, *, model: Any = None, model_name: str | None = None) -> tuple[dict[str, Any], dict[str, Tensor]]:  # fmt: skip
    """(cfg.json's dict, the tensors) of ``sae`` in SAELens's format. A transcoder needs the
    ``model`` it reads (its MLP norm's γ, β: SAELens's transcoders read ``ln2.hook_normalized``)."""
    cfg = sae.cfg
    act, transcoder = cfg.activation, cfg.arch == "transcoder"
    W_enc, b_enc = sae.W_enc.detach().double().cpu(), sae.b_enc.detach().double().cpu()
    tensors = {"W_dec": sae.W_dec.detach().cpu(), "b_dec": sae.b_dec.detach().cpu()}
    meta: dict[str, Any] = {"sae_lens_version": LAYOUT_VERSION, "hook_name": tl_hook(cfg.hook),
                            "model_from_pretrained_kwargs": dict(NO_PROCESSING),
                            "glassgpt": {"config": cfg.to_dict()}}  # fmt: skip
    if model_name:
        meta["model_name"] = model_name
    if transcoder:
        assert cfg.out_hook is not None
        meta["hook_name_out"] = tl_hook(cfg.out_hook)
        if model is None:
            raise GlassError(
                f"exporting the transcoder on {cfg.hook} needs its model (--model DIR): SAELens's "
                "transcoders read ln2.hook_normalized, before the norm's weight and bias"
            )
        norm = _ln2(model, _layer(cfg.hook))
        if norm is None:
            meta["hook_name"] = tl_hook(f"blocks.{_layer(cfg.hook)}.resid_mid")
        else:  # z = (γ⊙n + β) W_enc + b_enc = n (γ W_enc) + (β W_enc + b_enc)
            gamma, beta = norm
            W_enc, b_enc = gamma[:, None] * W_enc, b_enc + beta @ W_enc
    doc: dict[str, Any] = {"d_in": cfg.d_in, "d_sae": cfg.d_sae, "dtype": cfg.dtype, "device": "cpu",
                           "apply_b_dec_to_input": not transcoder, "normalize_activations": "none",
                           "reshape_activations": "hook_z" if cfg.hook.endswith(".attn.z") else "none"}  # fmt: skip
    if act in ("jumprelu", "batchtopk"):
        theta = sae.theta if act == "jumprelu" else sae.threshold.expand(cfg.d_sae)
        tensors["threshold"] = theta.detach().cpu().clone()
        doc["architecture"] = "jumprelu_transcoder" if transcoder else "jumprelu"
    elif act == "relu":
        doc["architecture"] = "transcoder" if transcoder else "standard"
    else:  # topk
        if transcoder and cfg.width_out != cfg.d_in:
            raise GlassError(
                f"a topk transcoder of d_in={cfg.d_in} ≠ d_out={cfg.width_out} has no SAELens "
                "architecture (SAELens's transcoders are ReLU or JumpReLU)"
            )
        doc.update(architecture="topk", k=cfg.k, rescale_acts_by_decoder_norm=False)
    if transcoder and doc["architecture"] != "topk":
        doc["d_out"] = cfg.width_out
    dtype = sae.W_enc.dtype
    tensors.update(W_enc=W_enc.to(dtype).contiguous(), b_enc=b_enc.to(dtype).contiguous())
    doc["metadata"] = meta
    return doc, {k: v.contiguous() for k, v in tensors.items()}


def save_saelens(sae: SAE, folder: str | Path, *, model: Any = None, model_name: str | None = None) -> Path:  # fmt: skip
    """Write ``sae`` as SAELens's ``cfg.json`` and ``sae_weights.safetensors`` (atomically)."""
    doc, tensors = to_saelens(sae, model=model, model_name=model_name)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / WEIGHTS_FILE, st_save(tensors))
    atomic_write(folder / CFG_FILE, (json.dumps(doc, indent=1) + "\n").encode())
    return folder


# -- import ----------------------------------------------------------------------------------


def _read(folder: Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    if not is_saelens(folder):
        raise InputFileError(f"{folder}: not an SAELens SAE folder (no {CFG_FILE} and {WEIGHTS_FILE})")  # fmt: skip
    try:
        doc = json.loads((folder / CFG_FILE).read_bytes())
        tensors = st_load((folder / WEIGHTS_FILE).read_bytes())
    except (OSError, ValueError, SafetensorError) as e:
        raise InputFileError(f"{folder}: unreadable ({e})") from None
    if not isinstance(doc, dict):
        raise InputFileError(f"{folder / CFG_FILE}: not a JSON object")
    return doc, tensors


def _need(tensors: dict[str, Tensor], name: str, shape: tuple[int, ...], source: Path) -> Tensor:
    t = tensors.get(name)
    if t is None:
        raise InputFileError(f"{source}: has no {name} (has {', '.join(sorted(tensors))})")
    if tuple(t.shape) != shape:
        raise InputFileError(f"{source}: {name} is {tuple(t.shape)}, cfg.json says {shape}")
    return t.double()


def _same_sae(extra: dict[str, Any], fields: dict[str, Any], arch: str) -> bool:
    """Whether the glassgpt config a glassgpt export left in the metadata describes these
    weights (same shapes, an activation SAELens saves as ``arch``)."""
    act = extra.get("transcoder_activation", "topk") if extra.get("arch") == "transcoder" else extra.get("arch")  # fmt: skip
    saved_as = {"relu": ("standard", "transcoder"), "topk": ("topk",),
                "jumprelu": ("jumprelu", "jumprelu_transcoder"),
                "batchtopk": ("jumprelu", "jumprelu_transcoder")}.get(str(act), ())  # fmt: skip
    same = all(extra.get(k) == fields.get(k) for k in ("d_in", "d_sae"))
    width = extra.get("d_out") or extra.get("d_in")
    return same and arch in saved_as and width == (fields.get("d_out") or fields["d_in"])


def _processed(doc: dict[str, Any], meta: dict[str, Any]) -> bool:
    if "glassgpt" in meta or not meta.get("model_name"):
        return False
    kwargs = meta.get("model_from_pretrained_kwargs") or doc.get("model_from_pretrained_kwargs") or {}  # fmt: skip
    return bool(kwargs.get("center_writing_weights", True))


def from_saelens(folder: str | Path, *, model: Any = None, processed: bool | None = None) -> SAE:
    """The SAE in SAELens's format in ``folder`` as glassgpt's, computing the same f and x̂
    (module docstring); with ``model`` (glassgpt's GPT), checked against it and, where the
    SAE read TransformerLens's processed model, folded to read glassgpt's activations."""
    folder = Path(folder)
    doc, tensors = _read(folder)
    source = folder / CFG_FILE
    meta = doc.get("metadata") or {}
    arch = doc.get("architecture", "standard")
    if arch not in ARCHITECTURES:
        raise InputFileError(
            f"{source}: SAELens architecture {arch!r} has no glassgpt counterpart (glassgpt reads "
            f"{', '.join(ARCHITECTURES)})"
        )
    norm = doc.get("normalize_activations", "none")
    if norm not in ("none", None, False):
        raise InputFileError(
            f"{source}: normalize_activations={norm!r}: fold the normalisation into the weights "
            "in SAELens first (glassgpt reads only 'none')"
        )
    try:
        d_in, d_sae = int(doc["d_in"]), int(doc["d_sae"])
        d_out = int(doc.get("d_out", d_in))
    except (KeyError, TypeError, ValueError) as e:
        raise InputFileError(f"{source}: no valid d_in, d_sae ({e})") from None
    hook = meta.get("hook_name") or doc.get("hook_name") or ""
    hook_out = meta.get("hook_name_out") or doc.get("hook_name_out")
    transcoder = "transcoder" in arch or bool(hook_out)
    W_enc = _need(tensors, "W_enc", (d_in, d_sae), folder)
    b_enc = _need(tensors, "b_enc", (d_sae,), folder)
    W_dec = _need(tensors, "W_dec", (d_sae, d_out), folder)
    b_dec = _need(tensors, "b_dec", (d_out,), folder)
    if not transcoder and not doc.get("apply_b_dec_to_input", True):
        b_enc = b_enc + b_dec @ W_enc  # x W_enc + b_enc = (x − b_dec) W_enc + (b_enc + b_dec W_enc)
    if arch == "topk" and doc.get("rescale_acts_by_decoder_norm"):
        norms = W_dec.norm(dim=-1).clamp_min(1e-8)
        W_enc, b_enc, W_dec = W_enc * norms, b_enc * norms, W_dec / norms[:, None]
    theta = None
    if "jumprelu" in arch:
        theta = _need(tensors, "threshold", (d_sae,), folder).clamp_min(0)

    extra = (meta.get("glassgpt") or {}).get("config")
    act = {"standard": "relu", "transcoder": "relu", "topk": "topk"}.get(arch, "jumprelu")
    dtype = _DTYPES.get(str(doc.get("dtype", "float32")), "float32")
    fields: dict[str, Any] = {"d_in": d_in, "d_sae": d_sae, "dtype": dtype}
    if transcoder:
        layer = re.search(r"blocks\.(\d+)\.", hook or hook_out or "")
        fields.update(arch="transcoder", transcoder_activation=act, d_out=d_out)
        if layer is not None:  # no hook named: an SAE of no model yet
            L = layer.group(1)
            fields.update(hook=f"blocks.{L}.mlp.in", out_hook=f"blocks.{L}.mlp_out")
    else:
        fields.update(arch=act, hook=glassgpt_hook(hook) if hook else "")
    if act == "topk":
        fields["k"] = int(doc.get("k", 100))
    if isinstance(extra, dict) and _same_sae(extra, fields, arch):
        fields = extra  # a glassgpt export: its own config (batchtopk, k, coefficients, hooks)
    try:
        cfg = SAEConfig.from_dict(fields)
    except ConfigError as e:
        raise InputFileError(f"{source}: {e}") from None

    if processed is None:
        processed = _processed(doc, meta)
    layer_no = int(cfg.hook.split(".")[1]) if cfg.hook.startswith("blocks.") else None
    if cfg.arch == "transcoder" and re.fullmatch(r"blocks\.\d+\.ln2\.hook_normalized", hook or ""):
        if model is None:
            raise GlassError(
                f"{folder}: this transcoder reads {hook} (before the norm's weight and bias); "
                "pass the model it reads (--model DIR) to fold them"
            )
        assert layer_no is not None
        ln = _ln2(model, layer_no)
        if ln is not None:  # n = (u − β)/γ:  z = u (W_enc/γ) + (b_enc − (β/γ) W_enc)
            gamma, beta = ln
            if bool((gamma == 0).any()):
                raise GlassError(f"blocks.{layer_no}.ln2 has a zero weight: {hook} cannot be recovered from mlp.in")  # fmt: skip
            W_enc, b_enc = W_enc / gamma[:, None], b_enc - (beta / gamma) @ W_enc
    elif cfg.arch == "transcoder" and hook and not (
        re.fullmatch(r"blocks\.\d+\.mlp\.in", hook)
        or (re.fullmatch(r"blocks\.\d+\.hook_resid_mid", hook) and model is not None
            and model.config.norm_placement == "post")
    ):  # fmt: skip
        raise GlassError(
            f"{folder}: this transcoder reads {hook}; glassgpt's transcoders read the MLP's input "
            "(TransformerLens's blocks.L.ln2.hook_normalized)"
        )
    if processed and cfg.arch != "transcoder" and _RESID.fullmatch(cfg.hook):
        centred = W_enc - W_enc.mean(0, keepdim=True)  # W_enc ← P W_enc
        b_enc = b_enc - b_dec @ (W_enc - centred)  # b_enc ← b_enc − b_dec (I − P) W_enc
        W_enc = centred
    elif processed and cfg.hook.endswith(".attn.z"):
        if model is None:
            raise GlassError(
                f"{folder}: this SAE reads hook_z of a model with its value biases folded; pass "
                "the model (--model DIR) to fold b_V into b_dec"
            )
        assert layer_no is not None
        b_dec = b_dec + _value_bias(model, layer_no)

    sae = SAE(cfg)
    dt = sae.W_enc.dtype
    with torch.no_grad():
        for name, value in (("W_enc", W_enc), ("b_enc", b_enc), ("W_dec", W_dec), ("b_dec", b_dec)):
            getattr(sae, name).copy_(value.to(dt))
        if theta is not None and cfg.activation == "jumprelu":
            sae.log_threshold.copy_(theta.log().to(dt))  # θ = 0: log 0 = −inf, exp(−inf) = 0
        elif theta is not None and cfg.activation == "batchtopk":
            if not bool((theta == theta[0]).all()):
                raise InputFileError(f"{source}: a batchtopk SAE needs one threshold for every latent")  # fmt: skip
            sae.threshold.copy_(theta[0].to(dt))
    if model is not None:
        check_model(sae, model)
    return sae.eval()
