"""circuit-tracer 0.5's side of ``bench/graphs.py``, run in circuit-tracer's own interpreter.

    /work/main/.venv-circuit-tracer/bin/python bench/graphs_ct.py DIR OUT.safetensors BATCH

DIR holds what ``bench/graphs.py`` wrote: ``model.safetensors`` (GPT-2's weights under
TransformerLens's names), ``clt.safetensors`` (the CLT in circuit-tracer's layout), ``meta.json``
(the shape, the prompt's ids). It builds circuit-tracer's ``TransformerLensReplacementModel``
and ``CrossLayerTranscoder`` on them, times ``attribute`` (cold, first call), and saves the
adjacency, the active features and the logit targets to OUT; its peak resident set is read
by the parent.

Why the shim: circuit-tracer 0.5's TransformerLens backend subclasses ``HookedTransformer``,
which TransformerLens 4 removed (this machine has 4.3; ``from transformer_lens import
HookedTransformer`` raises ImportError), and it imports ``HF_HUB_ENABLE_HF_TRANSFER``, which
huggingface_hub 1.x removed. Nothing may be installed here, so this file supplies the one
missing base class: a GPT-2 ``HookedTransformer`` written as TransformerLens 3's (the same hook
names, the same equations) on TransformerLens 4.3's ``HookedRootModule`` and ``HookPoint``,
which remain. circuit-tracer's own code runs unchanged on top of it: its replacement model
(the frozen patterns and norm scales, the MLP wrapper, the gradient hooks), its CLT, its
``attribute``.
"""

from __future__ import annotations

import json
import math
import sys
import time
import types
from pathlib import Path

import huggingface_hub.constants
import torch
import torch.nn.functional as F
import transformer_lens
from safetensors.torch import load_file, save_file
from torch import nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from graph_memory import reset_peak, status_mib

huggingface_hub.constants.HF_HUB_ENABLE_HF_TRANSFER = False  # removed in huggingface_hub 1.x


class Config(types.SimpleNamespace):
    """The fields of HookedTransformerConfig that circuit-tracer reads."""

    def to_dict(self) -> dict:
        return {**vars(self), "original_architecture": "GPT2LMHeadModel", "tokenizer_name": "gpt2",
                "n_key_value_heads": self.n_heads}  # fmt: skip


class LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.w, self.b, self.eps = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), eps
        self.hook_scale, self.hook_normalized = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w + self.b)


class Attention(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        H, d, dh = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q, self.W_K, self.W_V = (nn.Parameter(torch.zeros(H, d, dh)) for _ in range(3))
        self.b_Q, self.b_K, self.b_V = (nn.Parameter(torch.zeros(H, dh)) for _ in range(3))
        self.W_O, self.b_O = nn.Parameter(torch.zeros(H, dh, d)), nn.Parameter(torch.zeros(d))
        self.attn_type = "global"
        self.register_buffer("mask", torch.tril(torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool)))
        self.hook_q, self.hook_k, self.hook_v, self.hook_z = (HookPoint() for _ in range(4))
        self.hook_attn_scores, self.hook_pattern = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        q = self.hook_q(torch.einsum("btd,hde->bthe", x, self.W_Q) + self.b_Q)
        k = self.hook_k(torch.einsum("btd,hde->bthe", x, self.W_K) + self.b_K)
        v = self.hook_v(torch.einsum("btd,hde->bthe", x, self.W_V) + self.b_V)
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~self.mask[:T, :T], float("-inf"))
        pattern = self.hook_pattern(self.hook_attn_scores(scores).softmax(-1))
        z = self.hook_z(torch.einsum("bhqk,bkhe->bqhe", pattern, v))
        return torch.einsum("bqhe,hed->bqd", z, self.W_O) + self.b_O


class MLP(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.W_in, self.b_in = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_mlp)), nn.Parameter(torch.zeros(cfg.d_mlp))  # fmt: skip
        self.W_out, self.b_out = nn.Parameter(torch.zeros(cfg.d_mlp, cfg.d_model)), nn.Parameter(torch.zeros(cfg.d_model))  # fmt: skip
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.hook_pre(x @ self.W_in + self.b_in)
        return self.hook_post(F.gelu(pre, approximate="tanh")) @ self.W_out + self.b_out


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.ln1, self.attn = LayerNorm(cfg.d_model, cfg.eps), Attention(cfg)
        self.ln2, self.mlp = LayerNorm(cfg.d_model, cfg.eps), MLP(cfg)
        self.hook_resid_pre, self.hook_attn_out, self.hook_resid_mid = HookPoint(), HookPoint(), HookPoint()  # fmt: skip
        self.hook_mlp_out, self.hook_resid_post = HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        mid = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.ln1(x))))
        return self.hook_resid_post(mid + self.hook_mlp_out(self.mlp(self.ln2(mid))))


class Unembed(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.W_U = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_vocab))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.W_U + self.b_U


class Tokenizer:
    """The few tokenizer fields circuit-tracer reads (ids are given, never text)."""

    def __init__(self, eos: int) -> None:
        self.bos_token_id = self.eos_token_id = self.pad_token_id = eos
        self.vocab_size = eos + 1
        self.all_special_ids = [eos]

    def decode(self, ids: object) -> str:
        return " ".join(str(int(i)) for i in torch.as_tensor(ids).flatten())


class HookedTransformer(HookedRootModule):
    """GPT-2 as TransformerLens 3's HookedTransformer computes it (hook names included)."""

    def __init__(self, cfg: Config, **_: object) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Module()
        self.embed.W_E = nn.Parameter(torch.zeros(cfg.d_vocab, cfg.d_model))
        self.pos_embed = nn.Module()
        self.pos_embed.W_pos = nn.Parameter(torch.zeros(cfg.n_ctx, cfg.d_model))
        self.hook_embed, self.hook_pos_embed = HookPoint(), HookPoint()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_final = LayerNorm(cfg.d_model, cfg.eps)
        self.unembed = Unembed(cfg)
        self.tokenizer = Tokenizer(cfg.d_vocab - 1)  # GPT-2's <|endoftext|>: the last id
        self.setup()

    @property
    def W_E(self) -> torch.Tensor:
        return self.embed.W_E

    def forward(self, tokens: torch.Tensor, stop_at_layer: int | None = None) -> torch.Tensor:
        tokens = tokens[None] if tokens.ndim == 1 else tokens
        T = tokens.shape[1]
        x = self.hook_embed(self.embed.W_E[tokens]) + self.hook_pos_embed(self.pos_embed.W_pos[:T][None].expand(len(tokens), -1, -1))  # fmt: skip
        for block in self.blocks[:stop_at_layer]:
            x = block(x)
        if stop_at_layer is not None:
            return x
        return self.unembed(self.ln_final(x))


def main() -> None:
    folder, out, batch = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    meta = json.loads((folder / "meta.json").read_text())
    transformer_lens.HookedTransformer = HookedTransformer  # the base class TL 4 removed
    transformer_lens.HookedTransformerConfig = Config
    from circuit_tracer.attribution.attribute import attribute
    from circuit_tracer.replacement_model.replacement_model_transformerlens import (
        TransformerLensReplacementModel,
    )
    from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder

    L, d, n = meta["n_layers"], meta["d_model"], meta["d_sae"]
    cfg = Config(n_layers=L, d_model=d, n_heads=meta["n_heads"], d_head=d // meta["n_heads"],
                 d_mlp=4 * d, d_vocab=meta["n_vocab"], n_ctx=meta["n_ctx"], eps=1e-5,
                 device=torch.device("cpu"), dtype=torch.float32, model_name="gpt2-random",
                 output_logits_soft_cap=0.0)  # fmt: skip
    clt = CrossLayerTranscoder(L, n, d, activation_function="jump_relu", lazy_decoder=False,
                               feature_input_hook="ln2.hook_normalized",
                               feature_output_hook="hook_mlp_out", device=torch.device("cpu"),
                               dtype=torch.float32)  # fmt: skip
    clt.load_state_dict(load_file(folder / "clt.safetensors"))
    model = TransformerLensReplacementModel.from_config(cfg, clt)
    # circuit-tracer wraps each MLP and the unembedding (ReplacementMLP, ReplacementUnembed)
    weights = {k.replace(".mlp.", ".mlp.old_mlp.").replace("unembed.", "unembed.old_unembed."): v
               for k, v in load_file(folder / "model.safetensors").items()}  # fmt: skip
    got = model.load_state_dict(weights, strict=False)
    assert not got.unexpected_keys, got.unexpected_keys
    assert all(k.endswith("attn.mask") or k.startswith("transcoders.") for k in got.missing_keys), (
        got.missing_keys
    )
    ids = torch.tensor(meta["tokens"])
    load_peak = status_mib("VmHWM")  # imports, the model and the CLT loaded
    before = reset_peak()  # the call's own peak is then what it adds
    start, cpu = time.perf_counter(), time.process_time()
    graph = attribute(ids, model, batch_size=batch)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    call_peak = status_mib("VmHWM") - before
    peak = max(load_peak, status_mib("VmHWM"))
    save_file({"adjacency": graph.adjacency_matrix.contiguous(),
               "active": graph.active_features.contiguous(),
               "selected": graph.selected_features.contiguous(),
               "logits": torch.as_tensor([int(t.vocab_idx) for t in graph.logit_targets])},
              out)  # fmt: skip
    print(json.dumps({"seconds": seconds, "cpu_s": cpu, "peak_mib": peak, "call_mib": call_peak, "n_active": len(graph.active_features)}))  # fmt: skip


if __name__ == "__main__":
    main()
