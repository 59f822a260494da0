"""The SAELens side of tests/features/test_saelens.py and bench/sae.py, run by the interpreter
that has sae_lens (``.venv-saelens``: sae-lens 6 needs transformer-lens < 4). Imports nothing
from glassgpt; talks through safetensors files in one folder.

    python saelens_side.py DIR     reads DIR/job.json:
      "load": [case dirs]   sae_lens loads each glassgpt export, encodes DIR/case/x, decodes
                            → case/out.safetensors {f, x_hat}
      "make": [[name, architecture], ...]   sae_lens makes an SAE with random weights, saves it
                            (save_model) in DIR/name and encodes DIR/name/x → out.safetensors
      "tl": true            a random tiny GPT-2 (transformers), saved in DIR/hf; TransformerLens's
                            from_pretrained processing of it; SAEs on its processed activations
                            (resid_pre, hook_z, a transcoder on ln2.hook_normalized) with their
                            codes of DIR/tl_tokens
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _randomize(sae: Any, gen: Any, *, threshold: bool = False) -> None:
    import torch

    with torch.no_grad():
        for name, p in sae.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) * 0.5)
            if name == "threshold":
                p.copy_(p.abs() * 0.5 if threshold else p)


def make(folder: Path, name: str, arch: str, gen: Any, *, metadata: dict | None = None) -> Any:
    """sae_lens's own SAE of ``arch`` (float64, random weights), saved in folder/name."""
    import sae_lens
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.transcoder import (
        JumpReLUTranscoder,
        JumpReLUTranscoderConfig,
        Transcoder,
        TranscoderConfig,
    )

    d_in, d_sae, meta = 12, 40, SAEMetadata(**(metadata or {}))
    common = {"d_in": d_in, "d_sae": d_sae, "dtype": "float64", "metadata": meta}
    if arch == "standard":
        sae = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(**common))
    elif arch == "standard_no_b_dec":
        sae = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(**common, apply_b_dec_to_input=False))  # fmt: skip
    elif arch == "topk":
        sae = sae_lens.TopKSAE(sae_lens.TopKSAEConfig(**common, k=5))
    elif arch == "topk_rescaled":
        sae = sae_lens.TopKSAE(sae_lens.TopKSAEConfig(**common, k=5, rescale_acts_by_decoder_norm=True))  # fmt: skip
    elif arch == "jumprelu":
        sae = sae_lens.JumpReLUSAE(sae_lens.JumpReLUSAEConfig(**common))
    elif arch == "transcoder":
        sae = Transcoder(TranscoderConfig(**common, d_out=d_in, apply_b_dec_to_input=False))
    elif arch == "jumprelu_transcoder":
        sae = JumpReLUTranscoder(JumpReLUTranscoderConfig(**common, d_out=d_in, apply_b_dec_to_input=False))  # fmt: skip
    else:
        raise SystemExit(f"unknown architecture {arch}")
    _randomize(sae, gen, threshold=True)
    sae.save_model(folder / name)
    return sae


def encode_decode(sae: Any, case: Path, x: Any = None) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    if x is None:
        x = load_file(str(case / "x.safetensors"))["x"]
    sae.eval()
    with torch.no_grad():
        f = sae.encode(x)
        x_hat = sae.decode(f)
    save_file({"f": f.contiguous(), "x_hat": x_hat.contiguous()}, str(case / "out.safetensors"))


def tiny_gpt2(folder: Path) -> None:
    """A random GPT-2 (every weight and bias perturbed), saved as transformers saves it, and the
    SAELens SAEs trained (here: random) on TransformerLens's processed activations."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights

    gen = torch.Generator().manual_seed(1)
    hf_cfg = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=12, n_layer=2, n_head=2)  # fmt: skip
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            base = 1.0 if "ln" in name and name.endswith("weight") else 0.0
            p.copy_(base + 0.3 * torch.randn(p.shape, generator=gen))
    hf.save_pretrained(folder / "hf")
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=12, n_ctx=16, d_head=6, n_heads=2, d_mlp=48, d_vocab=50,
        act_fn="gelu_new", normalization_type="LN", eps=hf_cfg.layer_norm_epsilon,
        default_prepend_bos=False,
    )  # fmt: skip
    tl = HookedTransformer(cfg)
    tl.load_and_process_state_dict(convert_gpt2_weights(hf, cfg))  # from_pretrained's defaults
    tl.eval()
    tokens = load_file(str(folder / "tl_tokens.safetensors"))["tokens"]
    with torch.no_grad():
        _, cache = tl.run_with_cache(tokens)
        hf_logits = hf(tokens).logits
        tl_logits = tl(tokens)
    acts = {k: cache[k].double() for k in ("blocks.1.hook_resid_pre", "blocks.0.attn.hook_z",
                                           "blocks.1.ln2.hook_normalized", "blocks.1.hook_mlp_out")}  # fmt: skip
    gap = hf_logits.log_softmax(-1) - tl_logits.log_softmax(-1)  # center_unembed shifts logits
    save_file({"logit_gap": gap.abs().max().reshape(1),
               **{k: v.contiguous() for k, v in acts.items()}},
              str(folder / "tl_acts.safetensors"))  # fmt: skip
    import sae_lens
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.transcoder import Transcoder, TranscoderConfig

    def meta(hook: str, **more: Any) -> Any:
        return SAEMetadata(model_name="tiny-gpt2", hook_name=hook, **more)

    saes = {
        "tl_resid": sae_lens.TopKSAE(sae_lens.TopKSAEConfig(
            d_in=12, d_sae=32, k=4, dtype="float64", metadata=meta("blocks.1.hook_resid_pre"))),
        "tl_z": sae_lens.StandardSAE(sae_lens.StandardSAEConfig(
            d_in=12, d_sae=32, dtype="float64", reshape_activations="hook_z",
            metadata=meta("blocks.0.attn.hook_z"))),
        "tl_transcoder": Transcoder(TranscoderConfig(
            d_in=12, d_sae=32, d_out=12, dtype="float64", apply_b_dec_to_input=False,
            metadata=meta("blocks.1.ln2.hook_normalized", hook_name_out="blocks.1.hook_mlp_out"))),
    }  # fmt: skip
    inputs = {"tl_resid": acts["blocks.1.hook_resid_pre"], "tl_z": acts["blocks.0.attn.hook_z"],
              "tl_transcoder": acts["blocks.1.ln2.hook_normalized"]}  # fmt: skip
    for name, sae in saes.items():
        _randomize(sae, gen)
        sae.save_model(folder / name)
        encode_decode(sae, folder / name, inputs[name])


def main(folder: Path) -> None:
    import torch
    from sae_lens import SAE

    job = json.loads((folder / "job.json").read_text())
    for case in job.get("load", []):
        sae = SAE.load_from_disk(folder / case)
        encode_decode(sae, folder / case)
    gen = torch.Generator().manual_seed(0)
    for name, arch in job.get("make", []):
        sae = make(folder, name, arch, gen)
        encode_decode(sae, folder / name)
    if job.get("tl"):
        tiny_gpt2(folder)
    (folder / "done").write_text("ok\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
