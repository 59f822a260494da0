"""Decoding on a CPU from a recorded step: its kernels in one compiled call, no model Python.

A one-token step of a float32 (or int8) model on a CPU,

    x₀ = W_E[token] + P[n],   x_{l+1} = Block_l(x_l | cache),   logits = N_f(x_L) W_U + b_U,

runs as glassgpt's compiled kernels (the products, norms, GELU or SiLU, RoPE, cache writes
and attention) with Python between them: module calls, hooks that are off, the seams'
choices, views and allocations (``bench/generate.py`` measures what that costs a step). The
kernels and the buffers they work on are the same at every step; only the position n moves
(the cache column written, the n + 1 keys attended to, the position row P[n], the RoPE
angles' row cos[n], sin[n]).
:class:`ReplayedStep` runs one step eagerly while the kernels' recorder (``glassgpt.kernels.Recorder``) records its
compiled calls, then replays those calls for the following steps with n moved, and the
embedding x₀ computed by the compiled embedding (``glassgpt.kernels.embed_call``). The replay makes the same calls on the same
buffers in the same order, so its logits equal the eager step's bit for bit; where a product's
output goes straight into a residual sum, or SwiGLU's two products into its SiLU and gate,
one fused call does both in one parallel run, with the same arithmetic in the same order
(``glassgpt.kernels.fuse_calls``). The calls run as one compiled call
(``glassgpt.kernels.compile_calls``: each kernel's own C implementation, the GIL let go once
a step instead of once a kernel, so that a server's other threads do not hold the step up
between two kernels); a call without one (the soft cap's) is made from Python between two
compiled runs. With RoPE the
angles are a table [capacity, r/2] in float32, each row computed as the eager step computes
it at that position (once, at the recording); a compiled call copies row n into the buffers
the recorded rotations read (the sliding layers' own base has its own table).

It records only what it can replay: a plain :class:`~glassgpt.sample.cache.KVCache` without
padding or a server's slots (``glassgpt.serve.slots.SlotCache``, whose rows each have their
own length n_b: its compiled calls read the lengths when they run), no hooks, float32
activations (a bf16 model decodes on its copy with float32 activations over its bf16
weights, ``glassgpt.model.precision.decoding_copy``, chosen by ``glassgpt.sample.engine``), the decoder-only families' fields in :data:`COVERED` (grouped-query attention
read in place, QK-norm, partial and scaled RoPE, the parallel residual, q/k/v biases,
sliding windows, and Gemma's embedding scale, 1 + w gains, sandwich norms, soft caps and
attention scale), and every operation of the blocks a compiled kernel, a view, an
allocation, a float32 residual sum or gated product, one computed from the parameters alone,
or a tensor's tanh, product or division by numbers (the final soft cap, replayed by
PyTorch's own kernel); anything else, say a ReLU MLP, leaves decoding eager
(:attr:`why_not` names it). Prompts (several tokens) always run eagerly.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor

from glassgpt import kernels
from glassgpt.model.gpt import GPT, TokenError
from glassgpt.sample.cache import CacheFullError, KVCache


def unreplayable(model: GPT, cache: Any) -> str | None:
    """Why a one-token step of ``model`` over ``cache`` cannot be recorded (None: it can be
    tried; the recording may still find an operation it cannot replay)."""
    if not _per_row(cache) and (type(cache) is not KVCache or cache.pad is not None):
        return "the cache is padded or not a plain KVCache"
    if model.training:
        return "the model is in training mode"
    return unreplayable_model(model)


def unreplayable_model(model: GPT) -> str | None:
    """What rules out replaying ``model``'s one-token steps over any cache, in eval mode
    (None: nothing)."""
    if not kernels.OPS["record_step"].built():
        return "glassgpt's compiled kernels are not built"
    W_E = model.embed.W_E
    if W_E.device.type != "cpu" or W_E.dtype != torch.float32 or not W_E.is_contiguous():
        return "the model is not float32 on a CPU"
    why = uncovered(model)
    if why is not None:
        return why
    if model._hook_fns:
        return "hooks are attached"
    return None


# The family fields a replayed step computes: each is a compiled call, a view, a recorded
# sum or product, or computed from the parameters alone.
COVERED = frozenset((
    "n_kv_heads", "qkv_bias", "qk_norm", "rotary_fraction", "rope_scaling",
    "parallel_residual", "norm_offset", "sandwich_norm", "embed_scale", "attn_softcap",
    "final_softcap", "attn_scale", "sliding_window", "layer_types", "rope_local_base",
))  # fmt: skip


def uncovered(model: GPT) -> str | None:
    """The decoder-only family fields of ``model`` that a replayed step does not cover, in
    words (None: none): ``embed_scale`` beside a position table (x₀ = s · W_E[t] + P[n] is
    not one recorded call); fields outside :data:`COVERED`, if any."""
    config = model.config
    fields = [f for f in config.family_fields() if f not in COVERED]
    if config.embed_scale != 1.0 and model.pos_embed is not None:
        fields.insert(0, "embed_scale")
    return f"the replayed step does not cover {', '.join(fields)}" if fields else None


class ReplayedStep:
    """``step(tokens [B, 1])`` → logits [B, 1, n_vocab] of the next position of ``cache``,
    from the calls recorded by :meth:`record` (see the module docstring).

    The logits tensor is the recording's own buffer: the next call overwrites it.

    >>> from glassgpt.model import GPT, GPTConfig
    >>> from glassgpt.model.precision import cast
    >>> torch.manual_seed(0) and None
    >>> model = cast(GPT(GPTConfig(n_vocab=10, n_ctx=8, d_model=8, n_layers=1, n_heads=2)), "float32")
    >>> cache = KVCache.for_model(model, batch_size=1, last_only=True)
    >>> _ = model(torch.tensor([[1, 2]]), cache=cache)
    >>> step, _ = ReplayedStep.record(model, cache, torch.tensor([[3]]))
    >>> replayed = step(torch.tensor([[4]]))
    >>> eager = model(torch.tensor([[1, 2, 3, 4]]))[:, -1:]
    >>> bool(torch.allclose(replayed, eager, atol=1e-6))
    True
    """

    def __init__(self, cache: KVCache, calls: list[kernels.ReplayCall], keep: list[Any],
                 tokens: Tensor, logits: Tensor) -> None:  # fmt: skip
        self.cache, self.calls, self.keep = cache, calls, keep
        self.tokens, self.logits = tokens, logits
        self.ids = tokens.numpy()  # the same int64 buffer
        self.per_row = _per_row(cache)  # the recorded calls advance its lengths
        # a server's lengths read through NumPy (no PyTorch operation, which would let go of
        # the GIL between two steps; serve.runs)
        self.lengths = cache.lengths.numpy() if self.per_row and cache.lengths.is_cpu else None
        # the calls as one compiled call (the GIL let go once a step, not once a kernel);
        # None where kernels/_program.c is not built: the loop in __call__ makes them
        self.program = kernels.compile_calls(calls)

    @classmethod
    def record(
        cls, model: GPT, cache: KVCache, tokens: Tensor
    ) -> tuple[ReplayedStep | None, Tensor]:
        """Run ``model(tokens, cache=cache)`` (one token per row, in inference mode) while
        recording its compiled calls: (the step, or None where it cannot be replayed, and
        the step's logits). ``why_not`` on the class keeps the last reason."""
        why = unreplayable(model, cache)
        if why is None and (tokens.ndim != 2 or tokens.shape[1] != 1):
            why = "a step of more than one token"
        if why is not None:
            cls.why_not = why
            with torch.inference_mode():
                return None, model(tokens, cache=cache)
        rec = kernels.Recorder(0 if _per_row(cache) else cache.length)
        constants = {p.untyped_storage().data_ptr() for p in model.parameters()}
        mode = kernels.StepMode(rec, constants)
        first: list[Tensor] = []
        ropes: dict[int, tuple[Tensor, Tensor]] = {}  # each block's (cos, sin), by layer

        def start(_module: Any, args: tuple[Any, ...]) -> None:  # x₀ reaches block 0
            first.append(args[0])
            mode.active = True
            kernels.start_recording(rec)

        def angles(layer: int) -> Any:
            def seen(_module: Any, args: tuple[Any, ...]) -> None:
                if len(args) > 1 and args[1] is not None:
                    ropes[layer] = args[1]

            return seen

        hooks = [model.blocks[0].register_forward_pre_hook(start)]
        if model.rotary is not None:
            hooks += [block.register_forward_pre_hook(angles(i))
                      for i, block in enumerate(model.blocks)]  # fmt: skip
        try:
            with torch.inference_mode(), mode:
                logits = model(tokens, cache=cache)
        finally:
            for hook in hooks:
                hook.remove()
            kernels.stop_recording()
            mode.active = False
        assert isinstance(logits, Tensor)
        x0 = first[0] if first else None
        if rec.failed is None and (x0 is None or not _plain(x0) or not rec.calls):
            rec.fail("no recorded kernel calls" if x0 is not None else "no block")
        if rec.failed is not None:
            cls.why_not = rec.failed
            return None, logits
        if model.rotary is not None and len(ropes) != len(model.blocks):
            cls.why_not = "a block without its RoPE angles"
            return None, logits
        step = cls._build(model, cache, rec, x0, logits, ropes)  # type: ignore[arg-type]
        return step, logits

    why_not: str | None = None

    @classmethod
    def _build(
        cls, model: GPT, cache: KVCache, rec: kernels.Recorder, x0: Tensor, logits: Tensor,
        ropes: dict[int, tuple[Tensor, Tensor]],
    ) -> ReplayedStep:  # fmt: skip
        config = model.config
        B = x0.shape[0]
        with torch.inference_mode(False):
            tokens = torch.zeros(B, dtype=torch.long)
        keep: list[Any] = [rec.keep, x0, logits, tokens]
        per_row = _per_row(cache)
        table = None
        if model.pos_embed is not None:
            if hasattr(model.pos_embed, "W_P"):
                table = model.pos_embed.W_P.detach().contiguous()
            else:  # the fixed rows, computed as the eager step computes each of them
                table = model.pos_embed(config.n_ctx, 0, dtype=torch.float32)
            keep.append(table)
        embed = kernels.embed_call(
            (model.embed.W_E.data_ptr(), tokens.data_ptr(), 0 if table is None else table.data_ptr(),
             x0.data_ptr(), B, config.d_model, config.n_vocab, 0,
             cache.lengths.data_ptr() if per_row else 0),  # row b at lengths[b], or all at n
            () if per_row else (7,),
        )  # fmt: skip
        calls = [embed]
        if config.embed_scale != 1.0:  # x₀ = s · W_E[t] (no position table: checked before)
            calls.append(kernels.scale_call(x0.data_ptr(), x0.numel(), config.embed_scale))
        calls += _angle_calls(model, cache, ropes, keep)
        return cls(cache, [*calls, *kernels.fuse_calls(rec.calls)], keep, tokens, logits)

    def greedy(self, n_valid: int) -> list[int] | None:
        """Each row's argmax over the first ``n_valid`` logits of the last step (as
        ``rows.Rows`` picks it at temperature 0, without penalties), read from the
        recording's own buffer; None where a row holds a NaN or an infinite maximum.

        Between two steps PyTorch's code is cold (the step's weights streamed through every
        cache), so that each PyTorch operation is slow: this pick, and a step from a list of
        ids, make none."""
        B, V = self.tokens.shape[0], self.logits.shape[-1]
        return kernels.argmax_at(self.logits.data_ptr(), B, min(n_valid, V), V)

    def __call__(self, tokens: Tensor | list[int]) -> Tensor:
        """The next step's logits for ``tokens`` [B, 1] (or a list of B ids)."""
        cache = self.cache
        B = self.tokens.shape[0]
        per_row = self.per_row
        if self.lengths is not None:
            n = int(self.lengths[:B].max())
        else:
            n = int(cache.lengths[:B].max()) if per_row else cache.length
        if n + 1 > cache.capacity:
            raise CacheFullError(
                f"{n} cached + 1 new position exceed the cache capacity {cache.capacity}"
            )
        if isinstance(tokens, list):
            if len(tokens) != B:
                raise TokenError(f"a replayed step takes {B} ids, got {len(tokens)}")
            try:  # (NumPy's view of the token buffer: no PyTorch operation)
                self.ids[:] = tokens
            except (OverflowError, TypeError, ValueError) as e:
                raise TokenError(f"tokens must be integer ids: {e}") from None
        else:
            dtype = tokens.dtype
            if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
                raise TokenError(f"tokens must be integer ids, got dtype {tokens.dtype}")
            if tokens.shape != (B, 1):
                raise TokenError(f"a replayed step takes [{self.tokens.shape[0]}, 1] tokens, "
                                 f"got {tuple(tokens.shape)}")  # fmt: skip
            self.tokens.copy_(tokens.view(-1))
        try:
            if self.program is not None:
                self.program(n)
            else:
                _run_calls(self.calls, n)
        except ValueError as e:  # an id out of range (checked before anything is written)
            raise TokenError(str(e)) from None
        if not per_row:
            cache.length = n + 1
        return self.logits


def _run_calls(calls: list[kernels.ReplayCall], n: int) -> None:
    """Each recorded call from Python, its positions moved by n (the program's calls, made
    one by one)."""
    for fn, args, positional in calls:
        if positional:
            moved = list(args)
            for i in positional:
                moved[i] += n
            args = tuple(moved)
        fn(*args)


class GreedySteps:
    """``greedy(tokens, n_valid)`` → each row's argmax over the first ``n_valid`` logits of
    the next step of ``step``, the same ids as :meth:`ReplayedStep.greedy` after
    ``step(tokens)``, while the unembedding reads W_U's int8 copy (``glassgpt.kernels.greedy``:
    bounds on its error, and the few candidates that reach the best bound recomputed by the
    product's own kernel); None where that pick is None (the logits buffer then holds the
    full product, for the sampler).

    The step's recorded calls with its last one, the unembedding, replaced: built only for a
    greedy caller, so that a step that returns logits computes what it did. ``steps``,
    ``candidates`` and ``full`` count the steps, the candidates their bounds left (over the
    rows) and the steps that computed the full product (too many candidates: flat logits);
    after ``MISSES`` such steps in a row the next ``REST`` steps are plain ones (``plain``
    counts them), which do not pay for the int8 pass as well."""

    MISSES, REST = 4, 64

    def __init__(self, step: ReplayedStep, pack: kernels.UnembedInt8) -> None:
        self.step, self.pack = step, pack
        self._calls: dict[int, tuple[list[kernels.ReplayCall], Any, Any]] = {}
        self.steps = self.candidates = self.full = self.plain = 0
        self._misses = self._rest = 0

    @classmethod
    def of(cls, step: ReplayedStep, model: GPT) -> GreedySteps | None:
        """The greedy variant of ``step`` (a recording of ``model``), or None where its last
        call is not one panels product into its logits (a server's slots, a final soft cap,
        more rows than one call of the panels takes, the rows form)."""
        if step.per_row or not step.calls:
            return None
        found = kernels.unembedding(step.calls[-1])
        args = step.calls[-1][1]
        B, V = step.tokens.shape[0], step.logits.shape[-1]
        if found is None or args[3] != step.logits.data_ptr() or args[4] != B or args[6] != V:
            return None
        versions = tuple(0 if p.is_inference() else p._version for p in model.parameters())
        packs = _PACKS.setdefault(model, {})
        key = (*found, versions)
        if key not in packs:
            packs.clear()  # (another unembedding, or changed parameters: the old one is stale)
            address, K, N, half = found
            packs[key] = kernels.UnembedInt8(address, K, N, half, torch.get_num_threads())
        return cls(step, packs[key])

    def __call__(self, tokens: Tensor | list[int], n_valid: int) -> list[int] | None:
        step = self.step
        if self._rest:
            self._rest -= 1
            self.plain += 1
            step(tokens)
            return step.greedy(n_valid)
        if n_valid not in self._calls:
            call, out = kernels.greedy_call(step.calls[-1], self.pack, n_valid)
            calls = [*step.calls[:-1], call]  # (the pick made from Python after the program)
            self._calls[n_valid] = (calls, kernels.compile_calls(calls), out)
        calls, program, out = self._calls[n_valid]
        B = step.tokens.shape[0]
        out[B] = -1  # (the pick writes how it picked)
        full = step.calls, step.program
        step.calls, step.program = calls, program  # the step's own __call__ runs them
        try:
            step(tokens)
        finally:
            step.calls, step.program = full
        how = int(out[B])
        assert how >= 0, "the greedy pick did not run"
        self.steps += 1
        self.candidates += int(out[B + 1])
        self.full += how != 0
        self._misses = self._misses + 1 if how != 0 else 0
        if self._misses == self.MISSES:
            self._misses, self._rest = 0, self.REST
        return None if how == 2 else out[:B].tolist()


# each model's int8 copy of its unembedding, for greedy steps (made at the first one, kept
# while the model lives and its parameters are unchanged)
_PACKS: weakref.WeakKeyDictionary[GPT, dict[tuple[Any, ...], kernels.UnembedInt8]] = (
    weakref.WeakKeyDictionary()
)


def _angle_calls(
    model: GPT, cache: KVCache, ropes: dict[int, tuple[Tensor, Tensor]], keep: list[Any]
) -> list[kernels.ReplayCall]:
    """The calls that write row n of each RoPE table (cos and sin [capacity, r/2]) into the
    buffers the recorded rotations read (one pair per rotary module: the sliding layers' own
    base is another); row b's own position n_b for a server's slots."""
    calls: list[kernels.ReplayCall] = []
    done: set[int] = set()
    per_row = _per_row(cache)
    for layer, (cos, sin) in sorted(ropes.items()):
        if cos.data_ptr() in done:
            continue
        done.add(cos.data_ptr())
        block = model.blocks[layer]
        local = model.rotary_local is not None and block.kind == "sliding"  # type: ignore[union-attr]
        rotary = model.rotary_local if local else model.rotary
        assert rotary is not None
        tables = angle_tables(rotary, cache.capacity)
        keep += [cos, sin, *tables]
        half = cos.shape[-1]
        rows = cos.numel() // half
        for table, buf in zip(tables, (cos, sin), strict=True):
            calls.append(kernels.take_rows_call(
                (table.data_ptr(), buf.data_ptr(), rows, half, 0,
                 cache.lengths.data_ptr() if per_row else 0),
                () if per_row else (4,),
            ))  # fmt: skip
    return calls


def angle_tables(rotary: Any, capacity: int) -> tuple[Tensor, Tensor]:
    """cos, sin [capacity, r/2] float32, row p what the eager step computes at position p
    (``rotary(1, p)``): the same elementwise float64 angles, cosines and rounding, computed
    for all positions in one call (tests check every row's bits against the eager rows)."""
    with torch.inference_mode(False):
        cos, sin = rotary(capacity, 0, dtype=torch.float32)
    return cos.contiguous(), sin.contiguous()


def _per_row(cache: Any) -> bool:
    """Whether each row of ``cache`` has its own length (a server's slots)."""
    return getattr(cache, "per_row_lengths", False)


def _plain(x: Tensor) -> bool:
    """Whether x₀ is a contiguous float32 CPU [B, 1, d_model] tensor of its own."""
    return x.dtype is torch.float32 and x.is_cpu and x.is_contiguous() and x.ndim == 3
