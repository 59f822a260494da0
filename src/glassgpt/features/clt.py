"""Cross-layer transcoders (CLT): features that read one layer's MLP input and write to the
MLP outputs of that layer and every later one (Ameisen et al. 2025, *Circuit Tracing*).

    z_l    = u_l W_enc[l] + b_enc[l]                   u_l = blocks.l.mlp.in [..., d_model]
    a_l    = σ(z_l)                                    [..., d_sae] the layer's features
    ŷ_l'   = Σ_{l ≤ l'} a_l W_dec[l][l' − l] + b_dec[l']   predicts blocks.l'.mlp_out

with W_enc [L, d_model, d_sae], b_enc [L, d_sae], one decoder W_dec[l] [L − l, d_sae, d_model]
per source layer (its slices: one per target layer l' = l … L − 1), b_dec [L, d_model], and σ:

    jumprelu  σ(z) = z · H(z − θ), θ = exp(log_threshold) [L, d_sae]
    topk      σ(z) = ReLU(z) on the k largest zᵢ of each (token, layer)

Objective, per token (``loss``), the reconstructions of all L MLP outputs summed:

    mse       Σ_l' ‖y_l' − ŷ_l'‖²
    jumprelu  + λ Σ_l Σ_i tanh(c · a_l,i ‖W_dec,l,i‖)   (the paper's tanh penalty; ‖W_dec,l,i‖
              the norm of feature i's decoders over all its target layers; θ trained by the
              straight-through estimator of glassgpt.features.sparse)

Saved beside the SAE folder format: ``clt.json`` (format, config, extra) and
``clt.safetensors``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from glassgpt.config import Table, check, check_finite
from glassgpt.errors import GlassError, InputFileError
from glassgpt.features.dictionary_files import config_of, load_weights, write_folder
from glassgpt.features.sparse import jumprelu, sparse_decode, topk_encode, topk_relu
from glassgpt.formats import check_format

CLT_ARCHS = ("jumprelu", "topk")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
FORMAT, VERSION = "glassgpt-clt", 1
CONFIG_FILE, WEIGHTS_FILE = "clt.json", "clt.safetensors"


def clt_folder(path: str | Path) -> Path:
    """The folder holding clt.json: ``path``, or its ``clt/`` (a training folder)."""
    d = Path(path)
    return d / "clt" if not (d / CONFIG_FILE).is_file() and (d / "clt" / CONFIG_FILE).is_file() else d  # fmt: skip


@dataclass(frozen=True)
class CLTConfig(Table):
    """The shape and objective of one CLT; validated on construction (errors name the field).

    >>> CLTConfig(d_model=8, d_sae=16, n_layers=3, arch="topk", k=4).n_decoders
    6
    >>> CLTConfig(d_model=8, d_sae=16, n_layers=3, arch="topk")
    Traceback (most recent call last):
    ...
    glassgpt.errors.ConfigError: k: topk needs k (latents per token and layer)
    """

    d_model: int
    d_sae: int  # features per layer
    n_layers: int
    arch: str = "jumprelu"
    k: int | None = None  # topk: features kept per (token, layer)
    sparsity_coeff: float = 1e-3  # λ of the tanh penalty (jumprelu)
    tanh_c: float = 1.0  # c of the tanh penalty
    bandwidth: float = 1e-3  # jumprelu: ε of the rectangle kernel
    threshold_init: float = 1e-3  # jumprelu: θ at initialisation
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check(self.arch in CLT_ARCHS, "arch", f"must be one of {', '.join(CLT_ARCHS)}, got {self.arch!r}")  # fmt: skip
        for name in ("d_model", "d_sae", "n_layers"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, name, f"must be ≥ 1, got {value!r}")
        if self.arch == "topk":
            check(self.k is not None, "k", "topk needs k (latents per token and layer)")
            assert self.k is not None
            check(1 <= self.k <= self.d_sae, "k", f"must be in [1, d_sae={self.d_sae}], got {self.k}")  # fmt: skip
        check_finite(self, ("sparsity_coeff", "tanh_c"), positive=False)
        check_finite(self, ("bandwidth", "threshold_init"), positive=True)
        check(self.dtype in DTYPES, "dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")  # fmt: skip

    @property
    def n_decoders(self) -> int:
        """L (L + 1) / 2: one decoder per (source layer, target layer ≥ it)."""
        return self.n_layers * (self.n_layers + 1) // 2

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


class CLT(nn.Module):
    """A cross-layer transcoder (module docstring): ``encode``, ``decode``, ``forward``, ``loss``.

    >>> torch.manual_seed(0) and None
    >>> clt = CLT(CLTConfig(d_model=6, d_sae=10, n_layers=3, arch="topk", k=2), seed=0)
    >>> y_hat, acts = clt(torch.randn(4, 3, 6))      # u [N, L, d_model]
    >>> y_hat.shape, acts.shape, int((acts != 0).sum(-1).max())
    (torch.Size([4, 3, 6]), torch.Size([4, 3, 10]), 2)
    """

    def __init__(self, cfg: CLTConfig, *, seed: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        L, d, n, dtype = cfg.n_layers, cfg.d_model, cfg.d_sae, cfg.torch_dtype
        self.W_enc = nn.Parameter(torch.empty(L, d, n, dtype=dtype))
        self.b_enc = nn.Parameter(torch.zeros(L, n, dtype=dtype))
        self.W_dec = nn.ParameterList(
            nn.Parameter(torch.empty(L - l, n, d, dtype=dtype)) for l in range(L)
        )
        self.b_dec = nn.Parameter(torch.zeros(L, d, dtype=dtype))
        if cfg.arch == "jumprelu":
            theta = torch.full((L, n), math.log(cfg.threshold_init), dtype=dtype)
            self.log_threshold = nn.Parameter(theta)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int | None = None) -> None:
        """Decoders N(0, 1/(L·d_model)) (a feature's writes summed over layers stay O(1)),
        W_enc N(0, 1/d_model), biases 0."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        L, d = self.cfg.n_layers, self.cfg.d_model
        draw = lambda shape, std: torch.randn(shape, generator=gen, dtype=torch.float64) * std  # noqa: E731
        self.W_enc.copy_(draw(self.W_enc.shape, 1 / math.sqrt(d)))
        for W in self.W_dec:
            W.copy_(draw(W.shape, 1 / math.sqrt(L * d)))
        self.b_enc.zero_()
        self.b_dec.zero_()

    @property
    def theta(self) -> Tensor:
        """θ = exp(log_threshold) [L, d_sae] (jumprelu)."""
        return self.log_threshold.exp()

    # -- the equations --------------------------------------------------------------------
    def pre_acts(self, u: Tensor, layer: int | None = None) -> Tensor:
        """z = u W_enc + b_enc: u [..., L, d_model] → [..., L, d_sae], or one ``layer``'s
        u [..., d_model] → [..., d_sae]."""
        self._check(u, layer)
        u = u.to(self.W_enc.dtype)
        if layer is not None:
            return u @ self.W_enc[layer] + self.b_enc[layer]
        return torch.einsum("...ld,ldn->...ln", u, self.W_enc) + self.b_enc

    def activation(self, z: Tensor, layer: int | None = None) -> Tensor:
        """a = σ(z), z [..., L, d_sae] (or one ``layer``'s [..., d_sae])."""
        if self.cfg.arch == "topk":
            assert self.cfg.k is not None
            return topk_relu(z, self.cfg.k)
        if layer is not None:
            return jumprelu(z, self.theta[layer], self.cfg.bandwidth)
        # one threshold per (layer, feature): the estimator sums its gradient over the rows
        flat = jumprelu(z.flatten(-2), self.theta.flatten(), self.cfg.bandwidth)
        return flat.unflatten(-1, tuple(z.shape[-2:]))

    def encode(self, u: Tensor, layer: int | None = None) -> Tensor:
        """u [..., L, d_model] → a [..., L, d_sae] (or one ``layer``'s, as :meth:`pre_acts`)."""
        return self.activation(self.pre_acts(u, layer), layer)

    def decoder(self, source: int, target: int) -> Tensor:
        """W_dec[source][target − source] [d_sae, d_model]: how ``source``'s features write
        to layer ``target``'s MLP output (target ≥ source)."""
        if not 0 <= source <= target < self.cfg.n_layers:
            raise GlassError(f"no decoder from layer {source} to {target} ({self.cfg.n_layers} layers)")  # fmt: skip
        return self.W_dec[source][target - source]

    def decode(self, acts: Tensor) -> Tensor:
        """a [..., L, d_sae] → ŷ [..., L, d_model], ŷ_l' = Σ_{l ≤ l'} a_l W_dec[l][l'−l] + b_dec[l']."""
        L = self.cfg.n_layers
        outs = []
        for target in range(L):
            y = self.b_dec[target].expand(*acts.shape[:-2], -1)
            for source in range(target + 1):
                y = y + acts[..., source, :] @ self.decoder(source, target)
            outs.append(y)
        return torch.stack(outs, dim=-2)

    def forward(self, u: Tensor) -> tuple[Tensor, Tensor]:
        """(ŷ, a) for u [..., L, d_model]."""
        acts = self.encode(u)
        return self.decode(acts), acts

    def decoder_norms(self) -> Tensor:
        """‖W_dec,l,i‖ over all of feature (l, i)'s target layers [L, d_sae]."""
        return torch.stack([W.pow(2).sum((0, 2)).sqrt() for W in self.W_dec])

    @torch.no_grad()
    def rescaled(self, s_in: Tensor, s_out: Tensor) -> CLT:
        """The CLT on raw activations equivalent to this one trained on (s_in[l]·u_l,
        s_out[l]·y_l): W_enc[l] ← s_in[l] W_enc[l], W_dec[s][t − s] ← W_dec[s][t − s] / s_out[t],
        b_dec[t] ← b_dec[t] / s_out[t]; z, hence a and θ, unchanged.

        >>> clt = CLT(CLTConfig(d_model=3, d_sae=5, n_layers=2), seed=0)
        >>> u, s, t = torch.randn(4, 2, 3), torch.tensor([2.0, 3.0]), torch.tensor([0.5, 4.0])
        >>> y_hat, a = clt.rescaled(s, t)(u)
        >>> bool(torch.allclose(y_hat, clt(u * s[:, None])[0] / t[:, None], atol=1e-6))
        True
        """
        s_in, s_out = torch.as_tensor(s_in).to(self.b_dec), torch.as_tensor(s_out).to(self.b_dec)
        copy = CLT(self.cfg).to(self.b_dec.device)
        copy.load_state_dict(self.state_dict())
        copy.W_enc.mul_(s_in[:, None, None])
        for source, W in enumerate(copy.W_dec):
            W.div_(s_out[source:, None, None])
        copy.b_dec.div_(s_out[:, None])
        return copy.train(self.training)

    def loss(self, u: Tensor, y: Tensor) -> dict[str, Tensor]:
        """The objective's terms (module docstring), each a 0-d mean over tokens: ``mse``,
        ``sparsity``, their sum ``loss``; and ``y_hat``, ``acts``. u, y [..., L, d_model]."""
        self._check(y, None, what="target")
        y_hat, acts = self._sparse_forward(u) if self.cfg.arch == "topk" else self(u)
        mse = (y.to(y_hat.dtype) - y_hat).pow(2).sum((-2, -1)).mean()
        sparsity = mse.new_zeros(())
        if self.cfg.arch == "jumprelu" and self.cfg.sparsity_coeff > 0:
            weighted = torch.tanh(self.cfg.tanh_c * acts * self.decoder_norms())  # [..., L, n]
            sparsity = self.cfg.sparsity_coeff * weighted.sum((-2, -1)).mean()
        return {"loss": mse + sparsity, "mse": mse, "sparsity": sparsity, "y_hat": y_hat,
                "acts": acts}  # fmt: skip

    def _sparse_forward(self, u: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`forward` of a topk CLT by its k codes per (token, layer): the encoder's
        backward and every decoder's forward and backward read only the selected rows
        (glassgpt.features.sparse), O(k) where the dense path is O(d_sae); ``acts`` dense and
        detached (the loss does not read them)."""
        self._check(u, None)
        lead, (L, d) = u.shape[:-2], (self.cfg.n_layers, self.cfg.d_model)
        assert self.cfg.k is not None
        flat = u.to(self.W_enc.dtype).reshape(-1, L, d)
        ys = [self.b_dec[t].expand(len(flat), d) for t in range(L)]
        acts = flat.new_zeros(len(flat), L, self.cfg.d_sae)
        for source in range(L):
            values, index = topk_encode(flat[:, source], self.W_enc[source], self.b_enc[source], self.cfg.k)  # fmt: skip
            values = values.relu()
            acts[:, source].scatter_(-1, index, values.detach())
            for target in range(source, L):
                ys[target] = ys[target] + sparse_decode(values, index, self.decoder(source, target))
        return torch.stack(ys, dim=-2).reshape(*lead, L, d), acts.reshape(*lead, L, -1)

    def _check(self, x: Tensor, layer: int | None, what: str = "input") -> None:
        L, d = self.cfg.n_layers, self.cfg.d_model
        want = (d,) if layer is not None else (L, d)
        if tuple(x.shape[-len(want) :]) != want:
            raise GlassError(
                f"the CLT reads the MLP inputs of {L} layers of d_model={d}, got an {what} "
                f"of shape {tuple(x.shape)}"
            )

    # -- files ------------------------------------------------------------------------------
    def save(self, folder: str | Path, *, extra: dict[str, Any] | None = None) -> Path:
        """Write ``clt.json`` (format, config, ``extra``) and ``clt.safetensors`` atomically."""
        doc = {"format": FORMAT, "version": VERSION, "config": self.cfg.to_dict(), **(extra or {})}
        return write_folder(folder, (CONFIG_FILE, doc), (WEIGHTS_FILE, self.state_dict()))

    @classmethod
    def load(cls, folder: str | Path, *, device: str | torch.device | None = None) -> CLT:
        """The CLT saved in ``folder`` by :meth:`save` (or a training folder's ``clt/``)."""
        folder = clt_folder(folder)
        path = folder / CONFIG_FILE
        if not path.is_file():
            raise InputFileError(f"{folder}: not a CLT folder (no {CONFIG_FILE})")
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError) as e:
            raise InputFileError(f"{path}: unreadable ({e})") from None
        doc = check_format(doc, path, FORMAT, VERSION, what="CLT format", not_ours="not a glassgpt CLT file")  # fmt: skip
        clt = cls(config_of(CLTConfig, doc, path))
        load_weights(clt, folder / WEIGHTS_FILE, path)
        return (clt.to(device) if device is not None else clt).eval()
