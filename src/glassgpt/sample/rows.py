"""Per-row sampling of a batch in one pass: each row its own settings, held as tensors.

Row b of the logits z [B, V], with settings (T_b, k_b, p_b, m_b, r_b, f_b, a_b, β_b), token
counts c_b [V], seed s_b and n_b tokens drawn so far:

    z_b ← penalties(z_b; c_b, r_b, f_b, a_b) + β_b       (r = 1, f = a = 0, β = 0: off)
    T_b = 0:  x_b = argmax z_b                            (greedy)
    else:     z_b ← z_b / T_b, then top-k (k_b), top-p (p_b), min-p (m_b) as in sample.filters
              x_b = draw(z_b, u_b),   u_b = U(s_b, n_b)

Every operation acts on each row alone, and an "off" setting leaves a row's logits exactly
as they were (z/1, z·1, z − 0·c, z + 0), so a row gets the same bits whatever its batch
mates. A filter no row uses costs nothing; one that some rows use runs on every drawing
row, the others with the value that changes nothing (top-k 0, top-p 2, min-p 0), each
filter skipping their work (no gathering and putting back). U is counter-based
(:func:`uniforms`, SplitMix64 of the seed and the count), so there is no generator object
per row to step in a Python loop:
a row's uniforms depend on its own seed and count only. ``generate`` (a batch of its
prompts) and the server (a batch of slots) both sample through :class:`Rows`, so a request
gets the tokens ``generate`` gives, alone or beside any others.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from functools import reduce

import numpy as np
import torch
from torch import Tensor

from glassgpt import kernels
from glassgpt.errors import ConfigError
from glassgpt.sample.filters import SamplingConfig, draw, sorted_drop

# what a row uses, one bit each (``Rows.uses``): the step skips what no row uses; NEG: a
# negative frequency or presence penalty (the penalties' dense form, see _penalties)
REP, FREQ, PRES, BIAS, DRAW, TOP_K, TOP_P, MIN_P, NEG = (1 << i for i in range(9))
PENALTY, EVERY = REP | FREQ | PRES, (1 << 8) - 1
SMALL = 1024  # up to this vocabulary a step filters every row (an off setting is exact)

_GAMMA = 0x9E3779B97F4A7C15 - (1 << 64)  # SplitMix64's constants, as signed int64
_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_M2 = 0x94D049BB133111EB - (1 << 64)
_GAMMA_U, _M1_U, _M2_U = (np.uint64(c % (1 << 64)) for c in (_GAMMA, _M1, _M2))
_ONE, _S11, _S31 = np.uint64(1), np.uint64(11), np.uint64(31)


def wrap64(x: int) -> int:
    """``x`` modulo 2⁶⁴ as a signed int64 (a seed of any size fits a tensor).

    >>> wrap64(2**63), wrap64(-1), wrap64(5)
    (-9223372036854775808, -1, 5)
    """
    return (x + (1 << 63)) % (1 << 64) - (1 << 63)


def _shr(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 bits (``>>`` on int64 is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix(x: Tensor) -> Tensor:
    """SplitMix64's finaliser on int64 bits (products wrap modulo 2⁶⁴, as uint64's do)."""
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def uniforms(seeds: Tensor, counters: Tensor) -> Tensor:
    """u = ⌊mix(mix(s) + (n + 1)·γ) / 2¹¹⌋ · 2⁻⁵³ ∈ [0, 1), float64, for int64 seeds s and
    counters n of the same shape: the n-th uniform of the stream of seed s (SplitMix64's
    n-th output from the state mix(s)).

    >>> u = uniforms(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0]))
    >>> bool(((u >= 0) & (u < 1)).all()), len(set(u.tolist()))
    (True, 3)
    """
    return _stream(_mix(seeds.long()), counters)


def _stream(states: Tensor, counters: Tensor) -> Tensor:
    """:func:`uniforms` from the streams' states mix(s) (kept per row: half the operations);
    on a CPU in NumPy's uint64 over the batch, the same bits in a tenth of a step's sampling
    time (a [B] tensor operation costs microseconds, a dozen of them per draw)."""
    if states.is_cpu and counters.is_cpu:
        with np.errstate(over="ignore"):  # products wrap modulo 2⁶⁴, as SplitMix64's do
            n = counters.long().numpy().view(np.uint64)
            x = states.numpy().view(np.uint64) + (n + _ONE) * _GAMMA_U
            for shift, factor in ((30, _M1_U), (27, _M2_U)):
                x = (x ^ (x >> shift)) * factor
            x = x ^ (x >> _S31)
        return torch.from_numpy((x >> _S11).astype(np.float64) * 2.0**-53)
    x = states + (counters.long() + 1) * _GAMMA
    return _shr(_mix(x), 11).double() * 2.0**-53


class Rows:
    """The sampling settings and state of up to ``capacity`` rows (row b: one sequence).

    >>> rows = Rows(2, n_vocab=3)
    >>> rows.set(0, SamplingConfig(temperature=0), seed=0)
    >>> rows.set(1, SamplingConfig(logit_bias={0: 50.0}), seed=1)
    >>> ids, ok = rows.sample(torch.tensor([[0.0, 0.0, 9.0], [0.0, 0.0, 9.0]]))
    >>> ids.tolist(), ok.tolist(), rows.drawn.tolist()
    ([2, 0], [True, True], [1, 1])
    """

    def __init__(
        self, capacity: int, n_vocab: int, device: torch.device | str | None = None
    ) -> None:
        self.capacity, self.n_vocab = capacity, n_vocab
        self.device = torch.device(device or "cpu")

        def full(value: float, dtype: torch.dtype = torch.float32) -> Tensor:
            return torch.full((capacity,), value, dtype=dtype, device=self.device)

        self.temperature, self.top_p, self.min_p = full(1.0), full(1.0), full(0.0)
        self.top_k = full(0, torch.long)  # 0: off
        self.repetition, self.frequency, self.presence = full(1.0), full(0.0), full(0.0)
        self.seed, self.drawn = full(0, torch.long), full(0, torch.long)
        self._drawn = self.drawn.numpy() if self.drawn.is_cpu else None  # the same memory
        self.state = _mix(self.seed)  # mix(seed): the stream's state (uniforms)
        # each row's setting as a step over every row applies it: the value that changes
        # nothing where the row has it off (T = 0: 1, the argmax replaces the draw (small
        # vocabularies); top-p: 2; top-k's 0 and min-p's 0 do already)
        self.t_all, self.top_p_all = full(1.0), full(2.0)
        self.log_min_p = full(-math.inf)  # log m_b (min-p's threshold), taken at set()
        self.counts: Tensor | None = None  # [capacity, V] once a row has penalties
        self.bias: Tensor | None = None  # [capacity, V] once a row has a logit bias
        self.uses = [0] * capacity  # row b's bits (PENALTY, BIAS, DRAW, …)
        self._state = ("temperature", "top_p", "min_p", "top_k", "repetition", "frequency",
                       "presence", "seed", "drawn", "counts", "bias", "state", "t_all",
                       "top_p_all", "log_min_p")  # fmt: skip
        # NumPy's views of the CPU state (the same memory): a step's per-row arithmetic on
        # a few values in NumPy, without a PyTorch operation's cost each (the same IEEE bits)
        self._np = {n: getattr(self, n).numpy() for n in ("repetition", "frequency",
                    "presence")} if self.device.type == "cpu" else None  # fmt: skip

    def set(self, b: int, cfg: SamplingConfig, seed: int, history: Sequence[int] = ()) -> None:
        """Row b samples with ``cfg`` from the stream of ``seed``; ``history``: the tokens it
        has seen (the prompt), which the penalties count."""
        if cfg.logit_bias and cfg.logit_bias[-1][0] >= self.n_vocab:
            bad = cfg.logit_bias[-1][0]
            raise ConfigError("logit_bias", f"token id {bad} is out of range [0, {self.n_vocab})")
        self.temperature[b] = cfg.temperature
        self.top_k[b] = cfg.top_k or 0
        self.top_p[b] = 1.0 if cfg.top_p is None else cfg.top_p
        self.min_p[b] = cfg.min_p or 0.0
        self.log_min_p[b] = torch.log(self.min_p[b])  # torch.log's bits, once a request
        self.repetition[b] = cfg.repetition_penalty
        self.frequency[b] = cfg.frequency_penalty
        self.presence[b] = cfg.presence_penalty
        self.seed[b], self.drawn[b] = wrap64(seed), 0
        self.state[b] = _mix(self.seed[b])
        k, p, m = cfg.top_k or 0, cfg.top_p or 1.0, cfg.min_p or 0.0
        self.t_all[b] = cfg.temperature or 1.0
        self.top_p_all[b] = p if p < 1 else 2.0
        self.uses[b] = ((REP if cfg.repetition_penalty != 1 else 0)
                        | (FREQ if cfg.frequency_penalty != 0 else 0)
                        | (PRES if cfg.presence_penalty != 0 else 0)
                        | (BIAS if cfg.logit_bias else 0)
                        | (DRAW if cfg.temperature != 0 else 0)
                        | (TOP_K if 0 < k < self.n_vocab else 0) | (TOP_P if p < 1 else 0)
                        | (MIN_P if m > 0 else 0)
                        | (NEG if cfg.frequency_penalty < 0 or cfg.presence_penalty < 0
                           else 0))  # fmt: skip
        if cfg.penalised and self.counts is None:
            self.counts = torch.zeros(self.capacity, self.n_vocab, device=self.device)
            if self._np is not None:
                self._np["counts"] = self.counts.numpy()
        if self.counts is not None:
            self.counts[b].zero_()
            if cfg.penalised and len(history):
                ids = torch.tensor(list(history), dtype=torch.long, device=self.device)
                self.counts[b] += torch.bincount(ids, minlength=self.n_vocab).float()
        if cfg.logit_bias and self.bias is None:
            self.bias = torch.zeros(self.capacity, self.n_vocab, device=self.device)
            if self._np is not None:
                self._np["bias"] = self.bias.numpy()
        if self.bias is not None:
            self.bias[b].zero_()
            for i, beta in cfg.logit_bias:
                self.bias[b, i] = beta

    def move(self, src: int, dst: int) -> None:
        """Row ``src``'s settings and state into row ``dst`` (the server keeps its slots
        contiguous)."""
        for name in self._state:
            t = getattr(self, name)
            if t is not None:
                t[dst] = t[src]
        self.uses[dst] = self.uses[src]

    def sample(self, logits: Tensor, start: int = 0) -> tuple[Tensor, Tensor]:
        """The next id of rows start..start+B−1 from their logits [B, V], and whether each
        row had a finite logit ([B] long, [B] bool). Rows that drew count the token and
        step their counter; a row without a finite logit is left as it was."""
        B = logits.shape[0]
        r = slice(start, start + B)
        z, hot, zs = self._process(logits, start)
        ids = ok = None
        if hot is not None:  # the greedy rows' picks (the others' are drawn below)
            picked = kernels.argmax_rows(z)  # None off a CPU, or with a NaN or inf maximum
            if picked is not None:
                ids = torch.tensor(picked, device=z.device)
                ok = torch.ones(B, dtype=torch.bool, device=z.device)
        if hot is not None and (ids is None or ok is None):
            ids, ok = z.argmax(-1), torch.isfinite(z).any(-1)
        if hot is None:  # every row draws (a greedy row's draw is then replaced)
            ok, every = _finite(zs)
            u = _stream(self.state[r], self.drawn[r])
            ids = draw(zs if every else zs.masked_fill(~ok[:, None], 0.0), u)
            if not reduce(operator.and_, self.uses[r], DRAW):
                ids, ok = self._greedy(z, ids, ok, start)
        elif hot.numel() and ids is not None and ok is not None:
            fine, every = _finite(zs)
            u = _stream(self.state[r][hot], self.drawn[r][hot])
            zs = zs if every else zs.masked_fill(~fine[:, None], 0.0)
            ids[hot] = draw(zs, u).to(ids.device)
            ok[hot] = fine.to(ok.device)
        assert ids is not None and ok is not None
        took = ok.to(self.device)
        if self._drawn is not None:  # (NumPy's view: no PyTorch operation)
            self._drawn[r] += took.numpy()
        else:
            self.drawn[r] += took
        if self._np is not None and "counts" in self._np and ids.is_cpu:
            at = np.arange(start, start + B)  # one id a row: no repeated (row, id)
            self._np["counts"][at, ids.numpy()] += took.numpy()
        elif self.counts is not None:
            at = torch.arange(start, start + B, device=self.device)
            self.counts.index_put_((at, ids.to(self.device)), took.float(), accumulate=True)
        return ids, ok

    def _greedy(self, z: Tensor, ids: Tensor, ok: Tensor, start: int) -> tuple[Tensor, Tensor]:
        """(ids, ok) with the greedy rows' (T = 0) argmax of z and whether z's row is finite;
        the compiled ``kernels.argmax_rows`` written into the drawn rows' tensors in place
        where it takes z (a finite largest value: the row is finite), else ``torch.where``."""
        greedy = [b for b, u in enumerate(self.uses[start : start + len(z)]) if not u & DRAW]
        picked = kernels.argmax_rows(z)
        if picked is None or not (ids.is_cpu and ok.is_cpu):
            mask = self.temperature[start : start + len(z)] == 0
            ids = torch.where(mask, z.argmax(-1), ids)
            return ids, torch.where(mask, torch.isfinite(z).any(-1), ok)
        ids_np, ok_np = ids.numpy(), ok.numpy()  # (fresh tensors: draw's and _finite's)
        for b in greedy:
            ids_np[b], ok_np[b] = picked[b], True
        return ids, ok

    def probabilities(self, logits: Tensor, start: int = 0) -> Tensor:
        """The distribution each row draws from [B, V] (one-hot at the argmax when greedy);
        the state is left as it is."""
        z, hot, zs = self._process(logits, start)
        p = torch.zeros_like(z).scatter_(-1, z.argmax(-1, keepdim=True), 1.0)
        if hot is None:  # greedy rows (T = 0) are one-hot
            greedy = self.temperature[start : start + z.shape[0], None] == 0
            return torch.where(greedy, p, torch.softmax(zs, dim=-1))
        return p.index_copy(0, hot, torch.softmax(zs, dim=-1)) if hot.numel() else p

    def _process(self, logits: Tensor, start: int) -> tuple[Tensor, Tensor | None, Tensor]:
        """(z after penalties and bias [B, V], the rows that draw [h] (None: every row),
        their filtered logits [h, V])."""
        B = logits.shape[0]
        r = slice(start, start + B)
        uses = self.uses[r]
        some, every = reduce(operator.or_, uses, 0), reduce(operator.and_, uses, EVERY)
        z = logits.float()
        if some & (PENALTY | BIAS) and self._np is not None and z.is_cpu and not some & NEG:
            z = z.clone() if z is logits else z  # (changed in place below, through NumPy)
            self._penalise(z.numpy(), start, uses, some)
            some &= ~(PENALTY | BIAS)
        if some & PENALTY and self.counts is not None:
            z = _penalties(z, self.counts[r], self.repetition[r], self.frequency[r],
                           self.presence[r], some)  # fmt: skip
        if some & BIAS and self.bias is not None:  # the rows that have a bias alone (z + 0
            # would turn a −0 into +0: a row's bits would depend on its batch mates)
            at = [b for b, u in enumerate(uses) if u & BIAS]
            if len(at) == B:
                z = z + self.bias[r]
            else:
                at_t = torch.tensor(at, device=z.device)
                z = z.index_add(0, at_t, self.bias[r][at_t])
        if not some & DRAW:
            return z, z.new_zeros(0, dtype=torch.long), z[:0]
        T, small = self.temperature[r], z.shape[-1] <= SMALL
        if every & DRAW:
            hot, zs = None, z / T[:, None]
        elif small:  # greedy rows too, at T = 1: sample() takes their argmax instead
            hot, zs = None, z / self.t_all[r][:, None]
        else:
            hot = (T != 0).nonzero()[:, 0]
            zs = z[hot] / T[hot, None]  # [h, V]
        # each filter some row uses runs on every drawing row, an off row with the value
        # that changes nothing (each filter skips those rows' work)
        for bit, param, fn in ((TOP_K, self.top_k, _top_k), (TOP_P, self.top_p_all, _top_p),
                               (MIN_P, self.log_min_p, _min_p)):  # fmt: skip
            if some & bit:
                zs = fn(zs, param[r] if hot is None else param[r][hot])
        return z, hot, zs

    def _penalise(self, z: np.ndarray, start: int, uses: list[int], some: int) -> None:
        """:func:`_penalties` and the bias on a CPU, in place on z [B, V] (NumPy's float32
        operations: the same IEEE bits as PyTorch's), while no row's f or a is negative; the
        bias added to the rows that have one alone (a row without one is left as it is, as
        it is alone)."""
        assert self._np is not None
        B, np_ = z.shape[0], self._np
        with np.errstate(all="ignore"):  # inf and NaN logits pass through, as in PyTorch
            if some & PENALTY and "counts" in np_:
                c = np_["counts"][start : start + B]
                # the seen (row, id) pairs, as _penalties takes them (PyTorch's nonzero: a
                # third of NumPy's time over GPT-2's vocabulary)
                assert self.counts is not None
                b, i = self.counts[start : start + B].nonzero().numpy().T
                v, at = z[b, i], b + start
                if some & REP:
                    rep = np_["repetition"][at]
                    v = np.where(v > 0, v / rep, v * rep)
                if some & FREQ:
                    v = v - np_["frequency"][at] * c[b, i]
                if some & PRES:
                    v = v - np_["presence"][at]
                z[b, i] = v
            if some & BIAS and "bias" in np_:
                for b, u in enumerate(uses):
                    if u & BIAS:
                        z[b] += np_["bias"][start + b]


def _finite(z: Tensor) -> tuple[Tensor, bool]:
    """(whether each row of z [h, V] holds a finite logit, whether all do)."""
    found = kernels.finite_rows(z)
    if found is not None:
        return found
    ok = torch.isfinite(z).any(-1)
    return ok, bool(ok.all())


def _penalties(
    z: Tensor, counts: Tensor, rep: Tensor, freq: Tensor, pres: Tensor, some: int
) -> Tensor:
    """As ``filters.apply_penalties``, row b with its own r_b, f_b, a_b ([B] each); ``some``:
    the bits of the penalties some row uses.

    Only the seen ids (c > 0: a context's few) change, by the same operations on them alone:
    the dense form's unseen z − f·0 − a·0 is z itself while f, a ≥ 0 (z − (+0) keeps every
    bit, −0 included). A negative f or a (z − (−0) turns −0 into +0) takes the dense form."""
    if bool((freq < 0).any() | (pres < 0).any()):
        return _penalties_dense(z, counts, rep, freq, pres, some)
    b, i = counts.nonzero(as_tuple=True)  # [n] each: the seen (row, id) pairs
    v = z[b, i]
    if some & REP:
        r = rep[b]
        v = torch.where(v > 0, v / r, v * r)
    if some & FREQ:
        v = v - freq[b] * counts[b, i]
    if some & PRES:
        v = v - pres[b]  # a · [c > 0] = a · 1
    return z.index_put((b, i), v)


def _penalties_dense(
    z: Tensor, counts: Tensor, rep: Tensor, freq: Tensor, pres: Tensor, some: int
) -> Tensor:
    """:func:`_penalties` over every (row, id)."""
    seen = counts > 0
    if some & REP:
        z = torch.where(seen, torch.where(z > 0, z / rep[:, None], z * rep[:, None]), z)
    if some & FREQ:
        z = z - freq[:, None] * counts
    if some & PRES:
        z = z - pres[:, None] * seen
    return z


def _top_k(z: Tensor, k: Tensor) -> Tensor:
    """Row b keeps its k_b largest logits (and ties with the k_b-th); k: [h] long, a row with
    k_b outside [1, V) keeps every logit (its threshold is −∞: z < −∞ holds nowhere). On a
    CPU the compiled ``kernels.top_k_fill`` (its bits); elsewhere ``torch.topk``."""
    filled = kernels.top_k_fill(z, k)  # the same bits without torch.topk (a heap)
    if filled is not None:
        return filled
    V = z.shape[-1]
    on = (k > 0) & (k < V)
    k_max = int(torch.where(on, k, 0).max()) if k.numel() else 0
    if k_max == 0:
        return z
    largest = torch.topk(z, k_max, dim=-1).values  # [h, k_max], descending
    kth = largest.gather(-1, (k.clamp(1, k_max) - 1)[:, None])  # [h, 1]
    return z.masked_fill(z < torch.where(on[:, None], kth, -math.inf), -math.inf)


def _top_p(z: Tensor, p: Tensor) -> Tensor:
    """Row b keeps the shortest most-probable prefix whose mass reaches p_b (2: off): the bits
    of ``filters.top_p_drop``, whose kernel takes float32 rows on a CPU (no sort of the
    vocabulary); elsewhere PyTorch's sort of the rows that use top-p."""
    probs = torch.softmax(z, dim=-1)
    filled = kernels.top_p_fill(z, probs, p)  # (a row with p ≥ 2 keeps everything: its
    if filled is not None:  # mass before a token is below 2)
        return filled
    on = (p < 2).nonzero()[:, 0]  # without the kernel, the rows that use top-p alone (an
    # off row's p is 2: a softmax's mass before a token is below that, it drops nothing)
    if on.numel() < p.numel():
        return z.index_copy(0, on, _top_p(z[on], p[on])) if on.numel() else z
    return z.masked_fill(sorted_drop(probs, p), -math.inf)


def _min_p(z: Tensor, log_m: Tensor) -> Tensor:
    """Row b keeps tokens with p_i ≥ m_b · max p (z_i − z_max ≥ log m_b; m_b = 0: log 0 = −∞,
    every token); log_m: [h], ``torch.log`` of each m_b (``Rows.log_min_p``)."""
    filled = kernels.min_p_fill(z, log_m)  # the same bits in one compiled pass
    if filled is not None:
        return filled
    z_max = z.max(dim=-1, keepdim=True).values
    return z.masked_fill(z - z_max < log_m[:, None], -math.inf)
