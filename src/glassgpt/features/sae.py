"""Sparse autoencoders and transcoders: a sparse code for one activation of the model.

    z      = (x − b_dec) W_enc + b_enc                 pre-activations [..., d_sae]
    f      = σ(z)                                      the latents (sparse)
    x̂      = f W_dec + b_dec                           the reconstruction [..., d_in]

with W_enc [d_in, d_sae], b_enc [d_sae], W_dec [d_sae, d_in] (row i: latent i's direction),
b_dec [d_in], and σ by architecture, one class each (``SAE(cfg)`` builds the one cfg names):

    ReLU       σ(z) = ReLU(z)
    TopK       σ(z) = ReLU(z) on the k largest zᵢ of each token, 0 elsewhere (Gao et al. 2024)
    BatchTopK  training: ReLU(z) on the k·B largest z over the whole batch of B tokens;
               evaluation: z · 1[z > θ], θ the running mean of the least kept value, which
               the trainer keeps (glassgpt.features.training) (Bussmann et al. 2024)
    JumpReLU   σ(z) = z · H(z − θ), θ = exp(log_threshold) > 0 per latent
               (Rajamanoharan et al. 2024)
    transcoder reads the MLP's input x (``blocks.L.mlp.in``), predicts its output
               (``blocks.L.mlp_out``): z = x W_enc + b_enc (no centring: x̂ lives in another
               space), f = σ(z) with σ = ``transcoder_activation``, ŷ = f W_dec + b_dec

Training objective, per token, averaged over tokens (each class's ``loss``):

    mse       ‖y − x̂‖²                      (y = x, or the MLP's output for a transcoder)
    relu      + l1_coeff · Σᵢ fᵢ ‖W_dec,ᵢ‖   (Anthropic, April 2024 update; free decoder norms)
    jumprelu  + l0_coeff · Σᵢ H(zᵢ − θᵢ)    (θ trained by the straight-through estimator of
                                             glassgpt.features.sparse)
    topk      + aux_coeff · ‖e − ê‖²,  e = y − x̂ (no gradient),  ê = TopK_aux(z on dead
              latents) W_dec (AuxK, Gao et al. 2024; batchtopk and topk transcoders too)

Every architecture but ``relu`` keeps the decoder rows at unit norm
(:meth:`SAE.normalize_decoder`, :meth:`SAE.remove_parallel_grad`).
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
from glassgpt.features.sparse import (
    batch_topk_relu,
    jumprelu,
    sparse_decode,
    step,
    topk_encode,
    topk_relu,
)
from glassgpt.formats import check_format

ARCHS: tuple[str, ...] = ("topk", "batchtopk", "jumprelu", "relu", "transcoder")
ACTIVATIONS: tuple[str, ...] = ("topk", "batchtopk", "jumprelu", "relu")  # σ of a transcoder
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
FORMAT, VERSION = "glassgpt-sae", 1
CONFIG_FILE, WEIGHTS_FILE = "sae.json", "sae.safetensors"


@dataclass(frozen=True)
class SAEConfig(Table):
    """The shape and objective of one SAE; validated on construction (errors name the field).

    >>> SAEConfig(d_in=8, d_sae=32, arch="topk", k=4).activation
    'topk'
    >>> SAEConfig(d_in=8, d_sae=32, arch="topk", k=40)
    Traceback (most recent call last):
    ...
    glassgpt.errors.ConfigError: k: must be in [1, d_sae=32], got 40
    """

    d_in: int
    d_sae: int
    arch: str = "topk"
    k: int | None = None  # latents kept per token (topk; batchtopk: on average)
    hook: str = ""  # the activation read, e.g. blocks.1.resid_post (transcoder: blocks.1.mlp.in)
    out_hook: str | None = None  # transcoder: the activation predicted, blocks.1.mlp_out
    d_out: int | None = None  # transcoder: its width (default d_in)
    transcoder_activation: str = "topk"
    l1_coeff: float = 5.0  # relu
    l0_coeff: float = 1e-3  # jumprelu
    bandwidth: float = 1e-3  # jumprelu: ε of the rectangle kernel
    threshold_init: float = 1e-3  # jumprelu: θ at initialisation
    aux_k: int | None = None  # AuxK: dead latents used per token (default d_in // 2)
    aux_coeff: float = 1 / 32
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check(self.arch in ARCHS, "arch", f"must be one of {', '.join(ARCHS)}, got {self.arch!r}")
        for name in ("d_in", "d_sae"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, name, f"must be ≥ 1, got {value!r}")
        if self.d_out is not None:
            check(self.d_out >= 1, "d_out", f"must be ≥ 1, got {self.d_out}")
            check(self.arch == "transcoder", "d_out", "only a transcoder has an output width")
        check(
            self.transcoder_activation in ACTIVATIONS,
            "transcoder_activation",
            f"must be one of {', '.join(ACTIVATIONS)}, got {self.transcoder_activation!r}",
        )
        if self.activation in ("topk", "batchtopk"):
            check(self.k is not None, "k", f"{self.activation} needs k (latents per token)")
            assert self.k is not None
            check(1 <= self.k <= self.d_sae, "k", f"must be in [1, d_sae={self.d_sae}], got {self.k}")  # fmt: skip
        if self.aux_k is not None:
            check(1 <= self.aux_k <= self.d_sae, "aux_k", f"must be in [1, d_sae={self.d_sae}], got {self.aux_k}")  # fmt: skip
        check_finite(self, ("l1_coeff", "l0_coeff", "aux_coeff"), positive=False)
        check_finite(self, ("bandwidth", "threshold_init"), positive=True)
        check(self.dtype in DTYPES, "dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")  # fmt: skip

    @property
    def activation(self) -> str:
        """σ: the arch itself, or a transcoder's ``transcoder_activation``."""
        return self.transcoder_activation if self.arch == "transcoder" else self.arch

    @property
    def width_out(self) -> int:
        """The reconstruction's width: d_in, or a transcoder's d_out."""
        return self.d_out if self.d_out is not None else self.d_in

    @property
    def unit_decoder(self) -> bool:
        """Whether decoder rows are kept at unit norm (all but ``relu``, whose L1 weighs them)."""
        return self.activation != "relu"

    @property
    def aux_k_value(self) -> int:
        return self.aux_k if self.aux_k is not None else max(1, min(self.d_sae, self.d_in // 2))

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def sae_folder(sae_dir: str | Path) -> Path:
    """The folder holding sae.json: ``sae_dir``, or its ``sae/`` (a training folder)."""
    d = Path(sae_dir)
    return d / "sae" if not (d / CONFIG_FILE).is_file() and (d / "sae" / CONFIG_FILE).is_file() else d  # fmt: skip


def read_sae_json(folder: str | Path) -> tuple[Path, Any]:
    """(path, parsed JSON) of the SAE folder's ``sae.json``; one line when it is missing or
    unreadable."""
    path = sae_folder(folder) / CONFIG_FILE
    if not path.is_file():
        raise InputFileError(f"{folder}: not an SAE folder (no {CONFIG_FILE})")
    try:
        return path, json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise InputFileError(f"{path}: unreadable ({e})") from None


# -- the shared equations -------------------------------------------------------------------


class SAE(nn.Module):
    """A sparse autoencoder (or transcoder): ``encode``, ``decode``, ``forward``, ``loss``.
    ``SAE(cfg)`` is the architecture ``cfg.activation`` names (:data:`ARCHITECTURES`).

    >>> torch.manual_seed(0) and None
    >>> sae = SAE(SAEConfig(d_in=6, d_sae=24, arch="topk", k=3))
    >>> x_hat, acts = sae(torch.randn(2, 5, 6))
    >>> type(sae).__name__, x_hat.shape, acts.shape, int((acts != 0).sum(-1).max()) <= 3
    ('TopK', torch.Size([2, 5, 6]), torch.Size([2, 5, 24]), True)
    """

    def __new__(cls, cfg: SAEConfig | None = None, *args: Any, **kwargs: Any) -> SAE:
        if cls is SAE and cfg is not None:
            cls = ARCHITECTURES[cfg.activation]
        return super().__new__(cls)

    def __init__(self, cfg: SAEConfig, *, seed: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        dtype = cfg.torch_dtype
        d_in, d_sae, d_out = cfg.d_in, cfg.d_sae, cfg.width_out
        self.W_enc = nn.Parameter(torch.empty(d_in, d_sae, dtype=dtype))
        self.b_enc = nn.Parameter(torch.zeros(d_sae, dtype=dtype))
        self.W_dec = nn.Parameter(torch.empty(d_sae, d_out, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(d_out, dtype=dtype))
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int | None = None) -> None:
        """Decoder rows: random directions (unit norm; 0.1 for relu); W_enc = W_decᵀ when the
        shapes allow (else the same scale); biases 0."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        cfg = self.cfg
        w = torch.randn(cfg.d_sae, cfg.width_out, generator=gen, dtype=torch.float64)
        w = w / w.norm(dim=-1, keepdim=True) * (1.0 if cfg.unit_decoder else 0.1)
        self.W_dec.copy_(w)
        if cfg.arch == "transcoder" and cfg.width_out != cfg.d_in:
            v = torch.randn(cfg.d_in, cfg.d_sae, generator=gen, dtype=torch.float64)
            self.W_enc.copy_(v / math.sqrt(cfg.d_in))
        else:
            self.W_enc.copy_(w.T)
        self.b_enc.zero_()
        self.b_dec.zero_()

    def pre_acts(self, x: Tensor) -> Tensor:
        """z = (x − b_dec) W_enc + b_enc (a transcoder: x W_enc + b_enc), [..., d_sae]."""
        if self.cfg.arch != "transcoder":
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def encode(self, x: Tensor) -> Tensor:
        """x [..., d_in] → f = σ(z) [..., d_sae] (σ: the architecture's)."""
        raise NotImplementedError

    def decode(self, acts: Tensor) -> Tensor:
        """f [..., d_sae] → x̂ = f W_dec + b_dec [..., d_in (a transcoder: d_out)]."""
        return acts @ self.W_dec + self.b_dec

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(x̂, f)."""
        acts = self.encode(x)
        return self.decode(acts), acts

    def loss(
        self, x: Tensor, target: Tensor | None = None, *, dead: Tensor | None = None
    ) -> dict[str, Tensor]:
        """The training objective's terms (module docstring), each a 0-d mean over tokens:
        ``mse``, ``sparsity``, ``aux``, their sum ``loss``; and ``x_hat``, ``acts``.

        ``target``: what to reconstruct (default x; a transcoder's MLP output). ``dead``
        [d_sae] bool: the latents AuxK may use (none: no auxiliary term; relu and jumprelu
        have none).
        """
        raise NotImplementedError

    def inputs(self, x: Tensor, target: Tensor | None) -> tuple[Tensor, Tensor]:
        """(u, y): u = x − b_dec (a transcoder: x) as rows [N, d_in], and the target y."""
        y = x if target is None else target
        self._check_width(x, self.cfg.d_in)
        self._check_width(y, self.cfg.width_out, what="target")
        u = x.to(self.W_enc.dtype).reshape(-1, self.cfg.d_in)  # [N, d_in]
        return (u if self.cfg.arch == "transcoder" else u - self.b_dec), y

    def terms(self, x: Tensor, y: Tensor, u: Tensor, x_hat: Tensor, acts: Tensor, *,
              sparsity: Tensor | None = None, dead: Tensor | None = None) -> dict[str, Tensor]:  # fmt: skip
        """The loss's terms from x̂ [N, d_out] and f [N, d_sae] (AuxK on the ``dead`` latents)."""
        err = y.to(x_hat.dtype).reshape(len(u), -1) - x_hat
        mse = err.pow(2).sum(-1).mean()
        zero = mse.new_zeros(())
        sparsity = zero if sparsity is None else sparsity
        aux = zero
        if dead is not None and self.cfg.aux_coeff > 0 and bool(dead.any()):
            aux = self.cfg.aux_coeff * self.aux_loss(u, err.detach(), dead)
        shape = x.shape[:-1]
        return {
            "loss": mse + sparsity + aux,
            "mse": mse,
            "sparsity": sparsity,
            "aux": aux,
            "x_hat": x_hat.reshape(*shape, -1),
            "acts": acts.reshape(*shape, -1),
        }

    def aux_loss(self, u: Tensor, err: Tensor, dead: Tensor) -> Tensor:
        """AuxK: ‖e − TopK_aux(ReLU(z) on dead latents) W_dec‖², mean over tokens, with
        u = x − b_dec (a transcoder: x) [N, d_in] and e [N, d_out]; z formed on the dead
        latents' columns only."""
        cols = dead.nonzero().squeeze(-1)  # [n_dead]
        k = min(self.cfg.aux_k_value, len(cols))
        z = torch.addmm(self.b_enc[cols], u, self.W_enc[:, cols])  # [N, n_dead]
        values, index = z.topk(k, dim=-1, sorted=False)
        e_hat = sparse_decode(values.relu(), index, self.W_dec[cols])
        return (err - e_hat).pow(2).sum(-1).mean()

    # -- the unit-norm decoder ------------------------------------------------------------
    @torch.no_grad()
    def normalize_decoder(self) -> None:
        """W_dec,ᵢ ← W_dec,ᵢ / ‖W_dec,ᵢ‖ (unit-norm architectures only)."""
        if self.cfg.unit_decoder:
            self.W_dec.div_(self.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-12))

    @torch.no_grad()
    def remove_parallel_grad(self) -> None:
        """gᵢ ← gᵢ − (gᵢ · wᵢ) wᵢ for each decoder row wᵢ (unit norm): the step stays tangent
        to the sphere, so the renormalisation after it changes little."""
        g = self.W_dec.grad
        if self.cfg.unit_decoder and g is not None:
            w = self.W_dec
            g.sub_((g * w).sum(-1, keepdim=True) * w)

    @torch.no_grad()
    def rescaled(self, s_in: float, s_out: float | None = None) -> SAE:
        """The SAE on raw activations equivalent to this one trained on (s_in·x, s_out·y),
        its latents divided by s_out (so W_dec keeps its norms and f is in the model's units):
        W_enc ← (s_in/s_out) W_enc, b_enc ← b_enc/s_out, b_dec ← b_dec/s_out, θ ← θ/s_out
        (σ is positively homogeneous once its threshold is scaled; TopK's choice is unchanged).
        Only a transcoder has s_in ≠ s_out.

        >>> sae = SAE(SAEConfig(d_in=3, d_sae=6, arch="jumprelu"), seed=0)
        >>> x = torch.randn(4, 3)
        >>> x_hat, f = sae.rescaled(2.0)(x)
        >>> bool(torch.allclose(x_hat, sae(2 * x)[0] / 2) and torch.allclose(f, sae(2 * x)[1] / 2))
        True
        """
        s_out = s_in if s_out is None else s_out
        if self.cfg.arch != "transcoder" and s_out != s_in:
            raise GlassError("only a transcoder reads and writes activations of two scales")
        copy = SAE(self.cfg).to(self.W_enc.device)
        copy.load_state_dict(self.state_dict())
        copy.W_enc.mul_(s_in / s_out)
        copy.b_enc.div_(s_out)
        copy.b_dec.div_(s_out)
        copy.scale_threshold(s_out)
        return copy.train(self.training)

    def scale_threshold(self, s: float) -> None:
        """θ ← θ / s (architectures with a threshold)."""

    # -- the model it reads ---------------------------------------------------------------
    @property
    def layer(self) -> int | None:
        """The block index of ``cfg.hook`` (None for ``embed`` or ``ln_final.*``)."""
        parts = self.cfg.hook.split(".")
        return int(parts[1]) if len(parts) > 1 and parts[0] == "blocks" else None

    def _check_width(self, x: Tensor, width: int, what: str = "input") -> None:
        if x.shape[-1] != width:
            raise GlassError(
                f"the SAE reads {self.cfg.hook or 'an activation'} of width {width}, "
                f"got an {what} of shape {tuple(x.shape)}"
            )

    # -- files ------------------------------------------------------------------------------
    def state(self) -> dict[str, Tensor]:
        """The tensors saved: parameters and the batchtopk threshold."""
        return {name: t.detach() for name, t in self.state_dict().items()}

    def save(self, folder: str | Path, *, extra: dict[str, Any] | None = None) -> Path:
        """Write ``sae.json`` (format, config, ``extra``) and ``sae.safetensors`` atomically."""
        doc = {"format": FORMAT, "version": VERSION, "config": self.cfg.to_dict(), **(extra or {})}
        return write_folder(folder, (CONFIG_FILE, doc), (WEIGHTS_FILE, self.state()))

    @classmethod
    def load(cls, folder: str | Path, *, device: str | torch.device | None = None) -> SAE:
        """The SAE saved in ``folder`` (by :meth:`save` or ``glassgpt sae train``)."""
        folder = sae_folder(folder)
        path, doc = read_sae_json(folder)
        doc = check_format(doc, path, FORMAT, VERSION, what="SAE format", not_ours="not a glassgpt SAE file")  # fmt: skip
        sae = SAE(config_of(SAEConfig, doc, path))
        load_weights(sae, folder / WEIGHTS_FILE, path)
        if device is not None:
            sae = sae.to(device)
        return sae.eval()


# -- the architectures ------------------------------------------------------------------------


class ReLU(SAE):
    """σ(z) = ReLU(z); loss: mse + l1_coeff · Σᵢ fᵢ ‖W_dec,ᵢ‖ (decoder norms free)."""

    def encode(self, x: Tensor) -> Tensor:
        self._check_width(x, self.cfg.d_in)
        return self.pre_acts(x.to(self.W_enc.dtype)).relu()

    def loss(self, x: Tensor, target: Tensor | None = None, *, dead: Tensor | None = None) -> dict[str, Tensor]:  # fmt: skip
        u, y = self.inputs(x, target)
        acts = torch.addmm(self.b_enc, u, self.W_enc).relu()
        sparsity = self.cfg.l1_coeff * (acts * self.W_dec.norm(dim=-1)).sum(-1).mean()
        return self.terms(x, y, u, self.decode(acts), acts, sparsity=sparsity)


class TopK(SAE):
    """σ(z) = ReLU(z) on the k largest zᵢ of each token; loss: mse + AuxK on ``dead``. The
    loss takes the sparse path (:func:`topk_encode`): only the k kept latents of a token enter
    the backward, so its ``acts`` carry no gradient."""

    def encode(self, x: Tensor) -> Tensor:
        self._check_width(x, self.cfg.d_in)
        assert self.cfg.k is not None
        return topk_relu(self.pre_acts(x.to(self.W_enc.dtype)), self.cfg.k)

    def loss(self, x: Tensor, target: Tensor | None = None, *, dead: Tensor | None = None) -> dict[str, Tensor]:  # fmt: skip
        u, y = self.inputs(x, target)
        assert self.cfg.k is not None
        values, index = topk_encode(u, self.W_enc, self.b_enc, self.cfg.k)
        values = values.relu()
        x_hat = sparse_decode(values, index, self.W_dec) + self.b_dec
        with torch.no_grad():
            acts = values.new_zeros(len(u), self.cfg.d_sae).scatter_(-1, index, values)
        return self.terms(x, y, u, x_hat, acts, dead=dead)


class BatchTopK(SAE):
    """Training: ReLU(z) on the k·B largest z of the batch; evaluation: z · 1[z > θ]. θ (the
    ``threshold`` buffer) is the trainer's running mean of the least value kept, which
    ``loss`` returns as ``least`` (:func:`glassgpt.features.training.update_threshold`);
    loss: mse + AuxK on ``dead``."""

    def __init__(self, cfg: SAEConfig, *, seed: int | None = None) -> None:
        super().__init__(cfg, seed=seed)
        self.register_buffer("threshold", torch.zeros((), dtype=cfg.torch_dtype))

    def select(self, z: Tensor, over_batch: bool) -> tuple[Tensor, Tensor | None]:
        """(f, the least value kept over the batch, or None when thresholded at θ)."""
        assert self.cfg.k is not None
        if over_batch:
            return batch_topk_relu(z, self.cfg.k)
        return z * (z > self.threshold).to(z.dtype), None

    def encode(self, x: Tensor, *, batch_topk: bool | None = None) -> Tensor:
        """f; over the batch when ``batch_topk`` (default: in training mode), else at θ."""
        self._check_width(x, self.cfg.d_in)
        z = self.pre_acts(x.to(self.W_enc.dtype))
        return self.select(z, self.training if batch_topk is None else batch_topk)[0]

    def loss(self, x: Tensor, target: Tensor | None = None, *, dead: Tensor | None = None) -> dict[str, Tensor]:  # fmt: skip
        u, y = self.inputs(x, target)
        acts, least = self.select(torch.addmm(self.b_enc, u, self.W_enc), self.training)
        terms = self.terms(x, y, u, self.decode(acts), acts, dead=dead)
        if least is not None:
            terms["least"] = least.detach()
        return terms

    def scale_threshold(self, s: float) -> None:
        self.threshold.div_(s)


class JumpReLU(SAE):
    """σ(z) = z · H(z − θ), θ = exp(log_threshold) per latent; loss: mse + l0_coeff · Σᵢ
    H(zᵢ − θᵢ), θ trained by the straight-through estimator (:mod:`glassgpt.features.sparse`)."""

    def __init__(self, cfg: SAEConfig, *, seed: int | None = None) -> None:
        super().__init__(cfg, seed=seed)
        theta = torch.full((cfg.d_sae,), math.log(cfg.threshold_init), dtype=cfg.torch_dtype)
        self.log_threshold = nn.Parameter(theta)

    @property
    def theta(self) -> Tensor:
        """θ = exp(log_threshold) [d_sae]."""
        return self.log_threshold.exp()

    def encode(self, x: Tensor) -> Tensor:
        self._check_width(x, self.cfg.d_in)
        return jumprelu(self.pre_acts(x.to(self.W_enc.dtype)), self.theta, self.cfg.bandwidth)

    def loss(self, x: Tensor, target: Tensor | None = None, *, dead: Tensor | None = None) -> dict[str, Tensor]:  # fmt: skip
        u, y = self.inputs(x, target)
        z = torch.addmm(self.b_enc, u, self.W_enc)
        acts = jumprelu(z, self.theta, self.cfg.bandwidth)
        sparsity = self.cfg.l0_coeff * step(z, self.theta, self.cfg.bandwidth).sum(-1).mean()
        return self.terms(x, y, u, self.decode(acts), acts, sparsity=sparsity)

    def scale_threshold(self, s: float) -> None:
        self.log_threshold.sub_(math.log(s))


ARCHITECTURES: dict[str, type[SAE]] = {"relu": ReLU, "topk": TopK, "batchtopk": BatchTopK, "jumprelu": JumpReLU}  # fmt: skip
