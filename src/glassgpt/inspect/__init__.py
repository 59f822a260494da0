"""glassgpt.inspect: the transformer-circuits framework, executable on the model that trains.

    logits, cache = run_with_cache(model, tokens, names)     named activations; hooks patch them
    qk_circuit(model, l, h), ov_circuit(model, l, h)        a head's circuits from its weights
    logit_lens(model, tokens)                                the residual unembedded per layer
    direct_logit_attribution(model, tokens)                  logits = Σ parts, exactly
    head_scores(model)                                       previous-token / induction / duplicate

``glassgpt inspect --checkpoint DIR --prompt TEXT --output report.html`` puts it on one page.
"""

from __future__ import annotations

from glassgpt.inspect.ablation import ablation_hooks, run_ablated
from glassgpt.inspect.attribution import attribution_patch
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
from glassgpt.inspect.edges import Edges, edge_attribution_patch
from glassgpt.inspect.factored import FactoredMatrix, copying_score
from glassgpt.inspect.heads import HeadScores, head_scores, repeated_random_tokens
from glassgpt.inspect.lens import (
    Attribution,
    LogitLens,
    direct_logit_attribution,
    logit_lens,
    per_token_loss,
)
from glassgpt.inspect.patching import (
    activation_patch,
    get_act_patch_attn_head_all_pos_every,
    get_act_patch_attn_head_by_pos_every,
    get_act_patch_attn_head_k_all_pos,
    get_act_patch_attn_head_k_by_pos,
    get_act_patch_attn_head_out_all_pos,
    get_act_patch_attn_head_out_by_pos,
    get_act_patch_attn_head_pattern_all_pos,
    get_act_patch_attn_head_pattern_by_pos,
    get_act_patch_attn_head_pattern_dest_src_pos,
    get_act_patch_attn_head_q_all_pos,
    get_act_patch_attn_head_q_by_pos,
    get_act_patch_attn_head_v_all_pos,
    get_act_patch_attn_head_v_by_pos,
    get_act_patch_attn_out,
    get_act_patch_block_every,
    get_act_patch_mlp_out,
    get_act_patch_resid_mid,
    get_act_patch_resid_pre,
)
from glassgpt.inspect.paths import FINAL, MLP, Head, Receiver, path_patch, path_patch_heads

__all__ = [
    "FINAL",
    "MLP",
    "ActivationCache",
    "Attribution",
    "Edges",
    "FactoredMatrix",
    "Head",
    "HeadScores",
    "LogitLens",
    "Receiver",
    "ablation_hooks",
    "activation_patch",
    "attribution_patch",
    "composition_scores",
    "copying_score",
    "copying_scores",
    "direct_logit_attribution",
    "edge_attribution_patch",
    "get_act_patch_attn_head_all_pos_every",
    "get_act_patch_attn_head_by_pos_every",
    "get_act_patch_attn_head_k_all_pos",
    "get_act_patch_attn_head_k_by_pos",
    "get_act_patch_attn_head_out_all_pos",
    "get_act_patch_attn_head_out_by_pos",
    "get_act_patch_attn_head_pattern_all_pos",
    "get_act_patch_attn_head_pattern_by_pos",
    "get_act_patch_attn_head_pattern_dest_src_pos",
    "get_act_patch_attn_head_q_all_pos",
    "get_act_patch_attn_head_q_by_pos",
    "get_act_patch_attn_head_v_all_pos",
    "get_act_patch_attn_head_v_by_pos",
    "get_act_patch_attn_out",
    "get_act_patch_block_every",
    "get_act_patch_mlp_out",
    "get_act_patch_resid_mid",
    "get_act_patch_resid_pre",
    "head_scores",
    "logit_lens",
    "ov_circuit",
    "patch_hook",
    "path_patch",
    "path_patch_heads",
    "per_token_loss",
    "qk_circuit",
    "repeated_random_tokens",
    "resolve_names",
    "run_ablated",
    "run_with_cache",
    "run_with_hooks",
    "unembedding",
]
