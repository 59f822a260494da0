"""glassgpt.inspect: the transformer-circuits framework, executable on the model that trains.

    logits, cache = run_with_cache(model, tokens, names)     named activations; hooks patch them
    qk_circuit(model, l, h), ov_circuit(model, l, h)        a head's circuits from its weights
    logit_lens(model, tokens)                                the residual unembedded per layer
    direct_logit_attribution(model, tokens)                  logits = Σ parts, exactly
    head_scores(model)                                       previous-token / induction / duplicate

``glassgpt inspect --checkpoint DIR --prompt TEXT --output report.html`` puts it on one page.
Importing this package loads torch (its modules are the numerical ones).
"""

from __future__ import annotations

from glassgpt.inspect.cache import (
    ActivationCache,
    patch_hook,
    resolve_names,
    run_with_cache,
    run_with_hooks,
)
from glassgpt.inspect.circuits import (
    composition_scores,
    copying_scores,
    ov_circuit,
    qk_circuit,
    unembedding,
)
from glassgpt.inspect.factored import FactoredMatrix, copying_score
from glassgpt.inspect.heads import HeadScores, head_scores, repeated_random_tokens
from glassgpt.inspect.lens import (
    Attribution,
    LogitLens,
    direct_logit_attribution,
    logit_lens,
    per_token_loss,
)

__all__ = [
    "ActivationCache",
    "Attribution",
    "FactoredMatrix",
    "HeadScores",
    "LogitLens",
    "composition_scores",
    "copying_score",
    "copying_scores",
    "direct_logit_attribution",
    "head_scores",
    "logit_lens",
    "ov_circuit",
    "patch_hook",
    "per_token_loss",
    "qk_circuit",
    "repeated_random_tokens",
    "resolve_names",
    "run_with_cache",
    "run_with_hooks",
    "unembedding",
]
