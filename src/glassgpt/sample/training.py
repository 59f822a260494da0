"""The samples a run shows while it trains, drawn by the sampler's own :func:`generate`."""

from __future__ import annotations

import warnings

from torch import nn

from glassgpt.sample.generation import ContextWarning, generate
from glassgpt.train.config import RunConfig
from glassgpt.train.inputs import RunData
from glassgpt.train.session import OnEval, sample_prompt


def periodic_sampler(cfg: RunConfig, run_data: RunData) -> OnEval:
    """``on_eval(model, step)``: ``train.sample_tokens`` tokens after the run's sample prompt,
    drawn by :func:`glassgpt.sample.generate` with seed ``seed + step`` (its own generator:
    the training RNG never moves), ids below the tokenizer's vocabulary; None when
    ``train.sample_tokens`` is 0."""
    tokenizer = run_data.tokenizer
    prompt = sample_prompt(cfg, run_data)
    t = cfg.train
    sharded = t.parallel == "fsdp"

    def on_eval(model: nn.Module, step: int) -> str | None:
        if not t.sample_tokens:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ContextWarning)  # a glimpse: its window may slide
            ids = generate(
                model,  # type: ignore[arg-type]
                prompt,
                tokenizer=tokenizer,  # ids below its n_vocab (a padded model has more)
                max_new_tokens=t.sample_tokens,
                temperature=t.sample_temperature,
                top_k=t.sample_top_k,
                seed=cfg.seed + step,
                overflow="truncate",  # a long prompt keeps its end, as the context allows
                cuda_graph=False,  # one sample per evaluation: no graph worth its capture
                replay=not sharded,  # a sharded forward gathers its weights: nothing to replay
            )
        return "sample: " + tokenizer.decode(prompt + ids)  # type: ignore[operator]

    return on_eval
