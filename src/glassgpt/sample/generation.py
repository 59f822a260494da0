"""Autoregressive sampling: x_{t+1} ~ softmax(f_θ(x_≤t)_t / T), one token at a time.

    prefill:  logits = f_θ(prompt)           (the KV cache keeps every layer's k, v)
    step:     z = process(logits_last)        (penalties, temperature, top-k, top-p, min-p)
              x ~ softmax(z)  (argmax when T = 0)
              logits = f_θ(x | cache)         (one position: reads the weights once)

A batch of prompts of different lengths is left-padded into one [B, T] tensor; the cache
gives each row its own positions and hides the pad slots, so every row gets exactly the
tokens it would get alone (row b draws from its own stream, seeded ``seed + b``:
``glassgpt.sample.rows``, which the server samples through as well).

Context overflow policy: a model sees at most n_ctx positions.

- ``overflow="slide"`` (default): when the cache is full, the window slides: the last
  ``window`` tokens (default ⌊3·n_ctx/4⌋) are re-encoded and generation continues, so every
  token is predicted from at least ``window`` tokens of context; a ``ContextWarning`` says
  so once. ``window = n_ctx`` gives nanoGPT's crop-every-step semantics (every token
  predicted from the last n_ctx tokens, recomputed every step). A prompt longer than n_ctx is refused (``ContextOverflowError``): it is the
  user's input, and dropping part of it silently would be a surprise.
- ``overflow="truncate"``: as ``slide``, and a prompt longer than n_ctx keeps its last
  ``window`` tokens (with the warning).
- ``overflow="error"``: raise instead of sliding.

An empty prompt starts from ``<|endoftext|>`` when the tokenizer has it, else from id 0
(the first symbol of a character vocabulary); the start token is not part of the output.
"""

from __future__ import annotations

import codecs
import os
import sys
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from glassgpt.errors import ConfigError, GlassError
from glassgpt.model.gpt import GPT
from glassgpt.sample.cache import KVCache
from glassgpt.sample.engine import Decoder
from glassgpt.sample.filters import SamplingConfig, mask_padded
from glassgpt.sample.rows import Rows
from glassgpt.sample.steering import steered
from glassgpt.sample.stops import StopMatcher
from glassgpt.tokenizer.special import start_id


class ContextWarning(UserWarning):
    """The prompt and generation outgrow the model's context; the window slides."""


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside glassgpt/sample/, for ``warnings.warn``
    called by this function's caller: the warning names the user's line (their ``generate``
    call, or the loop over ``stream``), not a line inside these generators, whose depth
    varies."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1  # level 1: the function that calls warnings.warn
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame, level = frame.f_back, level + 1
    return level


class ContextOverflowError(GlassError, ValueError):
    """The context is full and ``overflow="error"``."""


@dataclass(frozen=True)
class GenerationConfig(SamplingConfig):
    """Sampling controls plus when to stop; every field is a keyword of ``generate``/``stream``."""

    max_new_tokens: int = 256
    stop: Sequence[str] = ()  # stop strings (need a tokenizer); the output ends before them
    stop_ids: Sequence[int] = ()  # token ids that end a row (not emitted), e.g. <|endoftext|>
    seed: int | Sequence[int] | None = None  # row b uses seed + b (or seed[b])
    overflow: Literal["slide", "truncate", "error"] = "slide"
    window: int | None = None  # tokens kept when the window slides (default 3·n_ctx/4)
    cuda_graph: bool = True  # on a GPU, replay each one-token step from a CUDA graph
    replay: bool = True  # on a CPU, replay each one-token step from its recorded kernel calls
    int8_argmax: bool = True  # a replayed greedy step picks reading W_U's int8 copy (same ids)

    def __post_init__(self) -> None:
        super().__post_init__()
        m = self.max_new_tokens
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise ConfigError("max_new_tokens", f"must be an integer ≥ 0, got {m!r}")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ConfigError("stop", f"must be a list of non-empty strings, got {self.stop!r}")
        if self.overflow not in ("slide", "truncate", "error"):
            raise ConfigError(
                "overflow", f"must be slide, truncate or error, got {self.overflow!r}"
            )
        w = self.window
        if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w < 1):
            raise ConfigError("window", f"must be an integer ≥ 1, got {w!r}")
        s = self.seed
        seeds = [s] if s is None or isinstance(s, int) else list(s)
        if not all(x is None or (isinstance(x, int) and not isinstance(x, bool)) for x in seeds):
            raise ConfigError("seed", f"must be an integer or a list of integers, got {s!r}")

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            logit_bias=self.logit_bias,
        )


def generate(
    model: GPT, tokens: Any, *, tokenizer: Any = None, steer: Sequence[Any] = (), **options: Any
) -> list[int] | list[list[int]]:
    """The new token ids after ``tokens`` (one prompt → list[int]; a batch → one list per row).

    ``tokens``: a list of ids or a 1-D tensor (one prompt), a list of such (prompts of any
    lengths), or a [B, T] tensor. ``options``: the fields of :class:`GenerationConfig`
    (``max_new_tokens, temperature, top_k, top_p, min_p, repetition_penalty,
    frequency_penalty, presence_penalty, logit_bias, stop, stop_ids, seed, overflow,
    window``). ``tokenizer`` is needed
    for ``stop`` strings and chooses the start token of an empty prompt. ``steer``: steering
    vectors (``glassgpt.sample.steering.Steer``) added while generating.

    >>> from glassgpt.model import GPT, GPTConfig
    >>> torch.manual_seed(0) and None
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=16, d_model=8, n_layers=1, n_heads=2))
    >>> out = generate(model, [1, 2, 3], max_new_tokens=5, temperature=0.8, seed=1)
    >>> len(out), out == generate(model, [1, 2, 3], max_new_tokens=5, temperature=0.8, seed=1)
    (5, True)
    """
    if steer:
        with steered(model, steer):
            return generate(model, tokens, tokenizer=tokenizer, **options)
    run = stream(model, tokens, tokenizer=tokenizer, **options)
    rows, single = run.rows, run.single  # type: ignore[attr-defined]
    out: list[list[int]] = [[] for _ in rows]
    for item in run:
        b, t = (0, item) if single else item
        out[b].append(t)
    return out[0] if single else out


class _Stream:
    """The iterator ``stream`` returns (validated before the first token is computed);
    ``decoder``: the decoding engine (``glassgpt.sample.engine``), from the first token on."""

    def __init__(self, rows: list[list[int]], single: bool) -> None:
        self._it: Iterator[Any] = iter(())
        self.rows, self.single = rows, single
        self.decoder: Decoder | None = None

    def _started(self, decoder: Decoder) -> None:
        self.decoder = decoder

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> Any:
        return next(self._it)

    def close(self) -> None:
        self._it.close()  # type: ignore[attr-defined]


def stream(model: GPT, tokens: Any, *, tokenizer: Any = None, **options: Any) -> Iterator[Any]:
    """Like :func:`generate`, yielding each token as soon as it is final: ints for one
    prompt, ``(row, id)`` pairs for a batch. Tokens that may begin a stop string are held
    back until they are known not to."""
    try:
        cfg = GenerationConfig(**options)
    except TypeError as e:
        raise ConfigError("options", str(e).split("__init__() ")[-1]) from None
    config = model.config
    rows, single = prompt_rows(tokens, config.n_vocab)
    start = start_id(tokenizer)
    rows = [r if r else [start] for r in rows]
    longest = max(len(r) for r in rows)
    if longest > config.n_ctx and cfg.overflow != "truncate":
        raise ContextOverflowError(
            f"a prompt of {longest} tokens is longer than the model's context "
            f"n_ctx={config.n_ctx}; shorten it, or let overflow='truncate' keep its end"
        )
    seeds = _seeds(cfg.seed, len(rows))
    stop_ids = frozenset(int(i) for i in cfg.stop_ids)
    matchers = [StopMatcher(tokenizer, cfg.stop) for _ in rows] if cfg.stop else None
    n_valid = min(config.n_vocab, getattr(tokenizer, "n_vocab", config.n_vocab))
    out = _Stream(rows, single)
    steps = _steps(model, rows, cfg, seeds, n_valid, out._started)

    def emit() -> Iterator[Any]:
        done = [False] * len(rows)
        for ids in steps:
            for b, t in enumerate(ids):
                if done[b]:
                    continue
                if t in stop_ids:
                    done[b] = True
                    out = matchers[b].flush() if matchers else []
                elif matchers:
                    out, done[b] = matchers[b].push(t)
                else:
                    out = [t]
                for x in out:
                    yield x if single else (b, x)
            if all(done):
                steps.close()
                return
        for b in range(len(rows)):
            if matchers and not done[b]:
                for x in matchers[b].flush():
                    yield x if single else (b, x)

    out._it = emit()
    return out


def prompt_rows(tokens: Any, n_vocab: int) -> tuple[list[list[int]], bool]:
    """(rows of ids, whether it was one prompt); raises naming a bad id or shape."""
    if isinstance(tokens, Tensor):
        if (
            tokens.dtype.is_floating_point
            or tokens.dtype == torch.bool
            or tokens.ndim not in (1, 2)
        ):
            raise GlassError(f"tokens must be integer ids [T] or [B, T], got {tokens.dtype} "
                             f"{tuple(tokens.shape)}")  # fmt: skip
        single = tokens.ndim == 1
        rows = [tokens.tolist()] if single else tokens.tolist()
    elif isinstance(tokens, Sequence) and not isinstance(tokens, (str, bytes)):
        single = all(not isinstance(t, (Sequence, Tensor)) for t in tokens)
        rows = [list(tokens)] if single else [_as_list(r) for r in tokens]
        if not rows:
            raise GlassError("an empty batch of prompts")
    else:
        raise GlassError(f"tokens must be ids (a list or tensor), got {type(tokens).__name__}")
    for r in rows:
        for t in r:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < n_vocab:
                raise GlassError(f"token id {t!r} is out of range [0, {n_vocab}) for this model")
    return rows, single


def _as_list(row: Any) -> list[int]:
    if isinstance(row, Tensor):
        return row.reshape(-1).tolist()
    if isinstance(row, Sequence) and not isinstance(row, (str, bytes)):
        return list(row)
    raise GlassError(f"each prompt must be a list of ids, got {type(row).__name__}")


def _seeds(seed: int | Sequence[int] | None, n: int) -> list[int]:
    if seed is None:
        base = int(torch.randint(0, 2**62, ()).item())  # from torch's global RNG
        return [base + b for b in range(n)]
    if isinstance(seed, int):
        return [seed + b for b in range(n)]
    if len(seed) != n:
        raise ConfigError("seed", f"got {len(seed)} seeds for {n} prompts")
    return list(seed)


def left_pad(rows: Sequence[Sequence[int]], device: torch.device) -> tuple[Tensor, list[int]]:
    """Rows right-aligned in a [B, max_len] tensor (pad id 0, hidden by the cache's mask)."""
    T = max(len(r) for r in rows)
    pads = [T - len(r) for r in rows]
    data = [[0] * p + list(r) for p, r in zip(pads, rows)]
    return torch.tensor(data, dtype=torch.long, device=device), pads


def _steps(
    model: GPT,
    rows: list[list[int]],
    cfg: GenerationConfig,
    seeds: list[int],
    n_valid: int,
    on_decoder: Callable[[Decoder], None] = lambda _: None,
) -> Generator[list[int], None, None]:
    """The sampled id of every row, step by step (finished rows are the caller's concern);
    ``on_decoder`` hears which decoding engine runs them, before the prompt does.

    Ids ≥ ``n_valid`` (a vocabulary padded beyond the tokenizer's) are never sampled."""
    if cfg.max_new_tokens == 0:
        return
    config = model.config
    n_ctx = config.n_ctx
    window = min(cfg.window or max(1, 3 * n_ctx // 4), n_ctx)
    param = next(model.parameters())
    device = param.device
    sampling = cfg.sampling
    hist = [list(r) for r in rows]  # every row's tokens so far (prompt + generated)
    sampler = Rows(len(rows), config.n_vocab, device)
    for b, r in enumerate(hist):
        sampler.set(b, sampling, seeds[b], r)
    warned = [False]

    def slide(what: str) -> list[list[int]]:
        if cfg.overflow == "error":
            raise ContextOverflowError(f"{what} exceed the model's context n_ctx={n_ctx}")
        if not warned[0]:
            warnings.warn(
                f"{what} exceed the model's context n_ctx={n_ctx}: sliding the window "
                f"(re-encoding the last {window} tokens)",
                ContextWarning,
                stacklevel=_callers_level(),
            )
            warned[0] = True
        return [r[-window:] for r in hist]

    T0 = max(len(r) for r in hist)
    view = hist if n_ctx >= T0 else slide(f"a prompt of {T0} tokens")
    tokens, pads = left_pad(view, device)
    capacity = min(n_ctx, tokens.shape[1] + cfg.max_new_tokens - 1)
    decoder = Decoder.start(model, len(rows), max(capacity, tokens.shape[1]), pads,
                            cuda_graph=cfg.cuda_graph, replay=cfg.replay)  # fmt: skip
    on_decoder(decoder)
    cache = decoder.cache
    logits: Tensor | None = _forward(decoder.model, tokens, cache)  # (a bf16 model's copy)
    # the raw argmax is the pick: a replayed step's own pick can serve
    plain_greedy = sampling.greedy and not sampling.penalised and not sampling.logit_bias
    bounded = plain_greedy and cfg.int8_argmax  # the next ids picked by the step itself
    picked: list[int] | None = None
    for step in range(cfg.max_new_tokens):
        ids, nxt = picked, None
        if plain_greedy and ids is None and logits is not None:
            ids = decoder.greedy(logits, n_valid)  # None: the sampler picks
        if ids is None:
            assert logits is not None
            last = mask_padded(logits[:, -1], n_valid)  # [B, V]
            nxt, ok = sampler.sample(last)  # [B]
            if not bool(ok.all()):
                raise GlassError("the model produced no finite logits (NaN or inf weights?)")
            ids = nxt.tolist()
        yield ids
        if step == cfg.max_new_tokens - 1:
            return
        for b, t in enumerate(ids):
            hist[b].append(t)
        picked = None
        if cache.length >= cache.capacity:
            tokens, pads = left_pad(slide(f"{len(hist[0])} tokens"), device)
            cache.reset(pads)
            logits = _forward(decoder.model, tokens, cache)  # (a bf16 model's decoding copy)
            continue
        # a list to a replayed step: no PyTorch operation between steps
        given = ids if decoder.takes_ids else _column(ids, nxt, device)
        if bounded:  # (logits None where the step picked: it computed none)
            picked, logits = decoder.step_greedy(given, n_valid)
        else:
            logits = decoder.step(given)


def _column(ids: list[int], nxt: Tensor | None, device: torch.device) -> Tensor:
    """The next ids as a [B, 1] tensor on ``device`` (``nxt``, the sampler's [B], where given)."""
    return (torch.tensor(ids) if nxt is None else nxt).to(device)[:, None]


@contextmanager
def _inference(model: GPT) -> Iterator[None]:
    """Eval mode and inference mode for the block (the model's mode restored after)."""
    training = model.training
    if training:
        model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        if training:
            model.train()


def _forward(model: GPT, tokens: Tensor, cache: KVCache) -> Tensor:
    """logits [B, 1, V] of the last position, in inference mode and without dropout."""
    with _inference(model):
        return model(tokens, cache=cache)


def decode_stream(tokenizer: Any, ids: Iterator[int]) -> Iterator[str]:
    """Text pieces as the ids arrive; a character split across tokens waits for its last byte.

    >>> from glassgpt.tokenizer import CharTokenizer
    >>> tok = CharTokenizer(["a", "é"])
    >>> "".join(decode_stream(tok, iter([0, 1, 0])))
    'aéa'
    """
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for t in ids:
        piece = decoder.decode(tokenizer.decode_bytes([t]))
        if piece:
            yield piece
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail
