"""The decoding engine of one model and one batch, chosen once: eager, replayed or graphed.

    eager:     logits = f_θ(x | cache)        every step through the model's Python
    replayed:  logits = replay(calls, n)      CPU: the first step's compiled calls, n moved
    graphed:   logits = graph.replay()        CUDA: the first step as one graph, one launch

All three compute the same logits (the replayed ones bit for bit). :func:`choose` decides
from the model (device, dtype, hooks, what the kernels can replay) and the batch (left-padded
or not, a server's slots or not), before the prompt runs; a :class:`Decoder` then runs every
one-token step of that choice, recording the replay or the graph at the first one. Both
``glassgpt.sample.generate`` and the server's scheduler (one decoder per batch size) ask here,
so the two decode a model the same way. A recording that meets an operation it cannot replay
turns the decoder eager for good (:attr:`Decoder.why` says why); hooks attached after the
choice (say, by the explorer) run the steps they see eagerly, without changing it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from glassgpt import kernels
from glassgpt.console import say
from glassgpt.model.gpt import GPT
from glassgpt.model.precision import decoding_copy
from glassgpt.sample.cache import KVCache
from glassgpt.sample.graphs import GraphedStep, StaticKVCache
from glassgpt.sample.replay import GreedySteps, ReplayedStep, uncovered, unreplayable_model

Kind = Literal["eager", "replayed", "graphed"]
SMALL_MODEL = 8_000_000  # parameters; below this a decoding step is too short to split


def is_small(model: GPT) -> bool:
    """Whether ``model``'s decoding steps are too short to share among CPU threads (sample
    and serve then run on one thread unless told otherwise)."""
    return sum(p.numel() for p in model.parameters()) < SMALL_MODEL


@dataclass(frozen=True)
class Choice:
    """An engine and, in one line, why it and not a faster one."""

    kind: Kind
    why: str


def choose(
    model: GPT,
    *,
    padded: bool = False,
    slots: bool = False,
    cuda_graph: bool = True,
    replay: bool = True,
) -> Choice:
    """The engine for one-token steps of ``model`` over a batch: left-``padded`` rows (a
    plain cache) or a server's ``slots`` (each row at its own length); ``cuda_graph`` and
    ``replay`` allow the graphed and replayed engines.

    >>> from glassgpt.model import GPT, GPTConfig
    >>> model = GPT(GPTConfig(n_vocab=10, n_ctx=8, d_model=8, n_layers=1, n_heads=2))
    >>> choose(model, replay=False)
    Choice(kind='eager', why='replay is off')
    """
    device = next(model.parameters()).device
    if model._hook_fns:
        return Choice("eager", "hooks are attached")
    if device.type == "cuda":
        if not cuda_graph:
            return Choice("eager", "CUDA graphs are off")
        if slots:
            return Choice("eager", "a server's slots are not graphed")
        if model.config.sliding_window is not None:  # its mask would be the recorded step's
            return _uncovered("a sliding window's mask moves with the position; not graphed")
        return Choice("graphed", "a CUDA GPU: each step one graph launch")
    if device.type != "cpu":
        return Choice("eager", f"no graphed or replayed steps on {device.type}")
    if not replay:
        return Choice("eager", "replay is off")
    if padded and not slots:
        return Choice("eager", "the batch is left-padded")
    why = unreplayable_model(model)
    if why is not None:
        return _uncovered(why) if why == uncovered(model) else Choice("eager", why)
    return Choice("replayed", "a CPU: each step the first one's compiled calls")


_SAID: set[str] = set()


def _uncovered(why: str) -> Choice:
    """The eager engine for a model with a field the fast engine does not cover, said once
    per process on stderr (never silently slower)."""
    if why not in _SAID:
        _SAID.add(why)
        say(f"decoding eagerly: {why}")
    return Choice("eager", why)


class Decoder:
    """One-token steps ``step(tokens) → logits [B, 1, V]`` of ``model`` over ``cache`` by
    ``choice``'s engine (see the module docstring).

    >>> from glassgpt.model import GPT, GPTConfig
    >>> from glassgpt.model.precision import cast
    >>> torch.manual_seed(0) and None
    >>> model = cast(GPT(GPTConfig(n_vocab=10, n_ctx=8, d_model=8, n_layers=1, n_heads=2)), "float32")
    >>> decoder = Decoder.start(model, batch_size=1, capacity=8)
    >>> with torch.inference_mode():
    ...     _ = model(torch.tensor([[1, 2]]), cache=decoder.cache)
    >>> logits = decoder.step(torch.tensor([[3]]))
    >>> decoder.kind == ("replayed" if unreplayable_model(model) is None else "eager")
    True
    """

    def __init__(self, model: GPT, cache: Any, choice: Choice) -> None:
        """(``model``: the model whose steps are taken, and whose forward the caller runs on
        ``cache`` for a prompt: for a bf16 CPU model, :func:`_bf16_replayed`'s copy.)"""
        self.model, self.cache, self.choice = model, cache, choice
        self._step: GraphedStep | ReplayedStep | None = None
        self.greedy_steps: GreedySteps | None = None  # the replayed step's greedy variant
        self._to_record = choice.kind != "eager"

    @classmethod
    def start(
        cls,
        model: GPT,
        batch_size: int,
        capacity: int,
        pad: list[int] | None = None,
        *,
        cuda_graph: bool = True,
        replay: bool = True,
    ) -> Decoder:
        """The engine chosen for ``model`` and a batch of ``batch_size`` rows (``pad``: each
        row's left padding), with a new cache of ``capacity`` positions of the kind the
        engine reads (only the last position's logits computed)."""
        choice = choose(model, padded=any(pad or ()), cuda_graph=cuda_graph, replay=replay)
        if choice.kind == "eager" and replay and not any(pad or ()):
            model, choice = _bf16_replayed(model, choice)
        kind = StaticKVCache if choice.kind == "graphed" else KVCache
        cache = kind.for_model(model, batch_size, capacity, pad=pad, last_only=True)
        return cls(model, cache, choice)

    @property
    def kind(self) -> Kind:
        return self.choice.kind

    @property
    def why(self) -> str:
        return self.choice.why

    @property
    def takes_ids(self) -> bool:
        """Whether :meth:`step` takes a list of ids as fast as a tensor (a replayed step
        reads a list with no PyTorch operation)."""
        return isinstance(self._step, ReplayedStep)

    def step(self, tokens: Tensor | list[int]) -> Tensor:
        """The logits [B, 1, V] after ``tokens`` ([B, 1], or B ids), in inference mode.

        The logits may be the engine's own buffer, overwritten by the next step."""
        model = self.model
        if model._hook_fns or (self._step is None and not self._to_record):
            return _eager(model, self._column(tokens), self.cache)
        if self._step is not None:
            return self._step(tokens if self.takes_ids else self._column(tokens))
        self._to_record = False
        if self.kind == "graphed":
            self._step = GraphedStep(model, self.cache)
            return self._step(self._column(tokens))
        training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                step, logits = ReplayedStep.record(model, self.cache, self._column(tokens))
        finally:
            model.train(training)
        if step is None:
            self.choice = Choice("eager", f"the recording failed: {ReplayedStep.why_not}")
        self._step = step
        return logits

    def greedy(self, logits: Tensor, n_valid: int) -> list[int] | None:
        """Each row's argmax over the first ``n_valid`` of ``logits``, read by the replayed
        step from its own buffer without a PyTorch operation; None where it cannot (another
        engine, other logits, a NaN or an infinite maximum): then ``rows.Rows`` samples the logits."""
        if isinstance(self._step, ReplayedStep) and logits is self._step.logits:
            return self._step.greedy(n_valid)
        return None

    def step_greedy(
        self, tokens: Tensor | list[int], n_valid: int
    ) -> tuple[list[int] | None, Tensor | None]:
        """(each row's argmax over the first ``n_valid`` logits after ``tokens``, or None,
        the logits or None): a replayed step whose unembedding reads its int8 copy
        (:class:`~glassgpt.sample.replay.GreedySteps`: the same ids, no logits) where it
        can, else :meth:`step` and :meth:`greedy`. Where the ids are None the logits are
        the step's, for the sampler."""
        step = self._step
        if isinstance(step, ReplayedStep) and not self.model._hook_fns:
            if self.greedy_steps is None or self.greedy_steps.step is not step:
                self.greedy_steps = GreedySteps.of(step, self.model)
            if self.greedy_steps is not None:
                ids = self.greedy_steps(tokens, n_valid)
                return ids, (step.logits if ids is None else None)
        logits = self.step(tokens)
        return self.greedy(logits, n_valid), logits

    def _column(self, tokens: Tensor | list[int]) -> Tensor:
        if isinstance(tokens, Tensor):
            return tokens
        return torch.tensor(tokens, device=next(self.model.parameters()).device)[:, None]


def decoding_model(model: GPT, *, replay: bool = True) -> GPT:
    """The model whose one-token steps the fast engine takes for ``model``: a bf16 CPU
    model's decoding copy, replayed (as :meth:`Decoder.start` picks it for ``generate``),
    else ``model`` itself. The server's slots and prompt caches are the copy's (float32 keys
    and values), so it serves every dtype through the engine ``generate`` uses."""
    if not replay:
        return model
    return _bf16_replayed(model, Choice("eager", "the model as it is"))[0]


# bf16 CPU models and their decoding copies (made at the first decoding, kept while the
# model's parameters are unchanged)
_COPIES: weakref.WeakKeyDictionary[GPT, tuple[tuple[int, ...], GPT, str]] = (
    weakref.WeakKeyDictionary()
)


def _bf16_replayed(model: GPT, choice: Choice) -> tuple[GPT, Choice]:
    """A bf16 CPU model's decoding copy (``glassgpt.model.precision.decoding_copy``: bf16
    weights under float32 activations, or float32 for a small model, which says so once) and
    its replayed engine; the model and ``choice`` themselves where there is none."""
    if model._hook_fns or next(model.parameters()).device.type != "cpu":
        return model, choice
    if not kernels.OPS["record_step"].built():  # (no copy that could not be replayed)
        return model, choice
    versions = tuple(0 if p.is_inference() else p._version for p in model.parameters())
    made = _COPIES.get(model)
    if made is None or made[0] != versions:
        found = decoding_copy(model)
        if found is None:
            return model, choice
        made = _COPIES[model] = (versions, *found)
    _, twin, what = made
    replayed = choose(twin)
    if replayed.kind != "replayed":
        return model, choice
    if what.startswith("float32") and what not in _SAID:
        _SAID.add(what)
        say(f"bf16: decoding computes in {what}")
    return twin, Choice("replayed", f"a CPU: each step the first one's compiled calls ({what})")


def _eager(model: GPT, tokens: Tensor, cache: Any) -> Tensor:
    """logits of ``model(tokens, cache=cache)`` in eval and inference mode (mode restored)."""
    training = model.training
    if training:
        model.eval()
    try:
        with torch.inference_mode():
            return model(tokens, cache=cache)
    finally:
        if training:
            model.train()
