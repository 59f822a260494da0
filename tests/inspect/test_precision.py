"""Every tensor a ``glassgpt.inspect`` function returns is in the model's dtype, at least float32.

float64 model → float64 results, float32 → float32. A bfloat16 model's activations and logits
stay bfloat16, while what inspect derives from them (probabilities, scores, losses, norms,
circuits, attributions) is computed and returned in float32. A result that went through
float32 on a float64 model would be exactly representable in float32; values computed in
float64 are (almost surely) not, which the float64 test checks too.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace

import pytest
import torch
from torch import Tensor

from glassgpt.inspect import cache, circuits, factored, heads, lens, metrics
from glassgpt.model import GPT

TOKENS = [1, 4, 2, 7, 3, 9]
CORRUPT = [1, 4, 5, 7, 3, 9]
INTERVENTIONS = (
    "patching",
    "attribution",
    "edges",
    "ablation",
)  # written alongside; covered once landed


def _landed(module: str) -> ModuleType | None:
    if importlib.util.find_spec(f"glassgpt.inspect.{module}") is None:
        return None
    return importlib.import_module(f"glassgpt.inspect.{module}")


@dataclass(frozen=True)
class Case:
    fn: Callable[[GPT], Tensor]
    derived: bool  # True: at least float32; False: the model's own dtype (activations, logits)
    ours: bool = True  # modules whose half-precision rule this file also checks


def _metric_cases() -> dict[str, Case]:
    def logits(m: GPT) -> Tensor:
        return cache.run_with_hooks(m, TOKENS, {})

    def corrupt(m: GPT) -> Tensor:
        return cache.run_with_hooks(m, CORRUPT, {})

    return {
        "metrics.logit_diff": Case(lambda m: metrics.logit_diff(3, 5)(logits(m)), True, False),
        "metrics.logprob": Case(lambda m: metrics.logprob(3)(logits(m)), True, False),
        "metrics.loss": Case(lambda m: metrics.loss(TOKENS)(logits(m)), True, False),
        "metrics.normalised": Case(
            lambda m: metrics.normalised(metrics.logprob(3), logits(m), corrupt(m))(
                (logits(m) + corrupt(m)) / 2
            ),
            True,
            False,
        ),
    }


def _metric(m: GPT) -> metrics.Metric:
    clean, corrupt = (cache.run_with_hooks(m, t, {}) for t in (TOKENS, CORRUPT))
    return metrics.normalised(metrics.logit_diff(3, 5), clean, corrupt)


def _intervention_cases() -> dict[str, Case]:
    out: dict[str, Case] = {}
    patching = _landed("patching")
    if patching is not None:

        def sweep(m: GPT, name: str) -> Tensor:  # 4 tokens: T² cells for the pattern
            _, clean = cache.run_with_cache(m, TOKENS[:4])
            metric = metrics.normalised(
                metrics.logit_diff(3, 5),
                cache.run_with_hooks(m, TOKENS[:4], {}),
                cache.run_with_hooks(m, CORRUPT[:4], {}),
            )
            return getattr(patching, name)(m, torch.tensor([CORRUPT[:4]]), clean, metric)

        for name in dir(patching):
            if name.startswith("get_act_patch_") and not name.endswith("_every"):
                out[f"patching.{name}"] = Case(lambda m, n=name: sweep(m, n), True, False)
        out["patching.activation_patch"] = Case(
            lambda m: patching.activation_patch(
                m,
                CORRUPT,
                cache.run_with_cache(m, TOKENS, "attn.v")[1],
                _metric(m),
                "v",
                by="layer_pos_head",
            ),
            True,
            False,
        )
    attribution = _landed("attribution")
    if attribution is not None:
        for site in ("resid_pre", "attn.z", "mlp_out", "attn.pattern"):
            out[f"attribution.attribution_patch.{site}"] = Case(
                lambda m, s=site: next(
                    iter(
                        attribution.attribution_patch(m, TOKENS, CORRUPT, _metric(m), [s]).values()
                    )
                ),
                True,
                False,
            )
    edges = _landed("edges")
    if edges is not None:
        for method in ("eap", "eap-ig"):
            out[f"edges.edge_attribution_patch.{method}"] = Case(
                lambda m, k=method: (
                    edges.edge_attribution_patch(m, TOKENS, CORRUPT, _metric(m), k, steps=3).scores
                ),
                True,
                False,
            )
    ablation = _landed("ablation")
    if ablation is not None:
        for how in ("zero", "mean", "resample"):
            out[f"ablation.run_ablated.{how}"] = Case(
                lambda m, h=how: ablation.run_ablated(
                    m,
                    TOKENS,
                    heads=[(0, 1)],
                    neurons=[(1, 3)],
                    how=h,
                    reference=None if h == "zero" else torch.tensor([CORRUPT, TOKENS]),
                    shuffle=True,
                ),
                False,
                False,
            )
    return out


def _dla(m: GPT) -> lens.Attribution:
    return lens.direct_logit_attribution(m, TOKENS)


CASES: dict[str, Case] = {
    "run_with_cache.logits": Case(lambda m: cache.run_with_cache(m, TOKENS, "pattern")[0], False),
    "run_with_cache.resid_post": Case(
        lambda m: cache.run_with_cache(m, TOKENS, "resid_post")[1]["blocks.1.resid_post"], False
    ),
    "run_with_cache.pattern": Case(
        lambda m: cache.run_with_cache(m, TOKENS, "pattern")[1]["pattern", 1], False
    ),
    "run_to_cache.attn.z": Case(
        lambda m: cache.run_to_cache(m, TOKENS, ["blocks.0.attn.z"])["blocks.0.attn.z"], False
    ),
    "run_with_hooks": Case(
        lambda m: cache.run_with_hooks(
            m,
            TOKENS,
            {
                "blocks.0.resid_post": cache.patch_hook(
                    cache.run_with_cache(m, CORRUPT, "blocks.0.resid_post")[1][
                        "blocks.0.resid_post"
                    ],
                    (slice(None), 2),
                )
            },
        ),
        False,
    ),
    "logit_lens.logits": Case(lambda m: lens.logit_lens(m, TOKENS).logits, False),
    "logit_lens.probs": Case(lambda m: lens.logit_lens(m, TOKENS).probs(), True),
    "logit_lens.top": Case(lambda m: lens.logit_lens(m, TOKENS).top(2)[0], True),
    "direct_logit_attribution.resid": Case(lambda m: _dla(m).resid, True),
    "direct_logit_attribution.logits": Case(lambda m: _dla(m).logits(), True),
    "direct_logit_attribution.total": Case(lambda m: _dla(m).total(torch.tensor([TOKENS])), True),
    "per_token_loss": Case(lambda m: lens.per_token_loss(m, TOKENS), True),
    **{
        f"head_scores.{score}": Case(
            lambda m, s=score: getattr(heads.head_scores(m, seq_len=3, batch=2), s), True
        )
        for score in heads.SCORES
    },
    "qk_circuit.full": Case(lambda m: circuits.qk_circuit(m, 1, 2).full(), True),
    "qk_circuit.position": Case(
        lambda m: circuits.qk_circuit(m, 1, query="position", key="position").full(), True
    ),
    "ov_circuit.full": Case(lambda m: circuits.ov_circuit(m, 0, 1).full(), True),
    "ov_circuit.norm": Case(lambda m: circuits.ov_circuit(m, 0).norm(), True),
    "ov_circuit.eigenvalues": Case(lambda m: circuits.ov_circuit(m, 1, 0).eigenvalues(), True),
    "ov_circuit.singular_values": Case(
        lambda m: circuits.ov_circuit(m, 1, 0).singular_values(), True
    ),
    "copying_score": Case(lambda m: factored.copying_score(circuits.ov_circuit(m, 0)), True),
    "copying_scores": Case(circuits.copying_scores, True),
    "unembedding": Case(circuits.unembedding, True),
    **{
        f"composition_scores.{k}": Case(lambda m, k=k: circuits.composition_scores(m, k), True)
        for k in ("q", "k", "v")
    },
    **_metric_cases(),
    **_intervention_cases(),
}


def _real_dtype(t: Tensor) -> torch.dtype:
    return t.real.dtype if t.is_complex() else t.dtype


@pytest.fixture
def models(tiny: SimpleNamespace) -> dict[torch.dtype, GPT]:
    """The same random model in three dtypes (sinusoidal positions: a table, not a weight)."""
    cfg = tiny.config(positional="sinusoidal")
    return {dt: tiny.model(cfg, dtype=dt) for dt in (torch.float64, torch.float32, torch.bfloat16)}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_results_are_in_the_models_dtype(
    name: str, dtype: torch.dtype, models: dict[torch.dtype, GPT]
) -> None:
    out = CASES[name].fn(models[dtype])
    assert isinstance(out, Tensor)
    assert _real_dtype(out) == dtype
    if dtype == torch.float64:
        finite = torch.view_as_real(out) if out.is_complex() else out
        finite = finite[finite.isfinite()]
        assert (finite != finite.float().double()).any(), "the values went through float32"


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c.ours))
def test_half_precision_derives_in_float32(name: str, models: dict[torch.dtype, GPT]) -> None:
    case = CASES[name]
    out = case.fn(models[torch.bfloat16])
    assert _real_dtype(out) == (torch.float32 if case.derived else torch.bfloat16)
    assert out.isfinite().any()


def test_every_public_tensor_function_is_covered() -> None:
    """Each public function of the audited modules appears in a case name (or is exempt)."""
    exempt = {
        "resolve_names",  # names, not tensors
        "as_batch",  # token ids
        "evaluating",  # a context manager
        "repeated_random_tokens",  # token ids
        "pattern_scores",  # pure in its input's dtype (head_scores covers it)
        "patch_hook",  # covered through run_with_hooks
        "check_layer_head",
        "block",
        "inputs",  # through qk_circuit.position
        "read_inputs",
        "folded_weights",  # through composition_scores
        "widened",
        "score_runs",  # through metrics.normalised
        "rows_that_fit",  # patching's batch size
        "free_bytes",
        "edge_names",  # names and a boolean mask
        "ablated_components",  # the plan (lists of indices)
        "ablation_hooks",  # through run_ablated
        "next_token_shift",  # Python floats, computed in float64
        "small_gap",  # two Python floats in, a bool out
        "shown_distance",  # an int from the config
        "get_act_patch_block_every",  # stacks of the sweeps above
        "get_act_patch_attn_head_all_pos_every",
        "get_act_patch_attn_head_by_pos_every",
    }
    names = " ".join(CASES)
    landed = [m for m in map(_landed, INTERVENTIONS) if m is not None]
    for module in (cache, circuits, factored, heads, lens, metrics, *landed):
        for attr in dir(module):
            obj = getattr(module, attr)
            if (
                attr.startswith("_")
                or not callable(obj)
                or getattr(obj, "__module__", None) != module.__name__
                or isinstance(obj, type)
            ):
                continue
            assert attr in names or attr in exempt, f"{module.__name__}.{attr} has no case"
