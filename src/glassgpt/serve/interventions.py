"""The explorer's interventions: activation patching between two prompts, and head ablation.

    POST /api/patch         m̂[l, t] of patching resid_pre, m̂[l, h] of patching each head's z
    POST /api/patch/effect  one patch's next-token distribution beside the clean and corrupted ones
    GET  /api/patch/example the page's built-in pair: the first of EXAMPLES that this tokenizer
                            reads as two prompts of the same number of tokens
    POST /api/ablate        the logits at one position with heads zero-ablated (z[:, :, h] = 0),
                            of the served model or (with ``step``) the run's checkpoint of that
                            step, so that the page compares them with that step's own logits

    m = z_T[answer] − z_T[wrong]       m̂ = (m_patched − m_corrupted) / (m_clean − m_corrupted)

The base run is the corrupted prompt; the clean run's activation is put in its place
(``glassgpt.inspect.patching``'s direction), so m̂ = 0 is the corrupted run and 1 the clean.
The answer defaults to the clean run's most likely next token and the wrong answer to the
corrupted run's (its second, if both runs agree). Both prompts must have the same number of
tokens. The sweeps are ``get_act_patch_resid_pre`` and ``get_act_patch_attn_head_out_all_pos``,
computed once per pair and answer; a clicked cell is one more forward with the same patch.
Ablation is ``glassgpt.inspect.ablation.ablation_hooks(how="zero")``. Every forward holds the
scheduler's lock.
"""

from __future__ import annotations

import base64
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from glassgpt.errors import GlassError
from glassgpt.inspect.ablation import ablation_hooks
from glassgpt.inspect.cache import evaluating, patch_hook, run_with_cache, run_with_hooks
from glassgpt.inspect.metrics import logit_diff, normalised, small_gap
from glassgpt.inspect.patching import get_act_patch_attn_head_out_all_pos, get_act_patch_resid_pre
from glassgpt.inspect.report import encode_prompt
from glassgpt.serve.errors import APIError
from glassgpt.serve.state import ServeState
from glassgpt.tokenizer.display import token_texts, visible

KEEP = 4  # prompt pairs kept
TOP = 8  # tokens shown in a patch's distribution
# (clean, corrupted) pairs that differ in one name, best known first. "When Mary and John…" has
# equal lengths on GPT-2 and on characters, not on a small BPE of Python source (" Mary" and
# " John" split differently: 38 against 37 tokens), where the code ones do.
EXAMPLES = (
    ("When Mary and John went to the store, John gave a drink to",
     "When Mary and John went to the store, Mary gave a drink to"),
    ("When John and Mary went to the store, Mary gave a drink to",
     "When John and Mary went to the store, John gave a drink to"),
    ("When Tom and Ann went to the park, Tom gave a ball to",
     "When Tom and Ann went to the park, Ann gave a ball to"),
    ("x = 1\ny = 2\nprint(x", "x = 1\ny = 2\nprint(y"),
    ("a = b + c\nreturn a", "a = b + c\nreturn b"),
    ("def f(a, b):\n    return a", "def f(a, b):\n    return b"),
    ("a b c d a b c", "a b c d a b e"),
)  # fmt: skip


def b64(t: torch.Tensor) -> str:
    """A tensor's bytes as base64 (the page reads them as a typed array)."""
    return base64.b64encode(t.contiguous().cpu().numpy().tobytes()).decode("ascii")


class Patch(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    clean: str
    corrupted: str
    answer: StrictInt | StrictStr | None = None  # an id, or text that is one token
    wrong: StrictInt | StrictStr | None = None


class PatchCell(Patch):
    site: Literal["resid_pre", "head"]
    layer: StrictInt
    index: StrictInt  # the position (resid_pre) or the head


class Ablate(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    prompt: str
    pos: StrictInt | None = None
    heads: list[Annotated[list[StrictInt], Field(min_length=2, max_length=2)]] = []  # [l, h]
    step: StrictInt | None = None  # a kept checkpoint's step (None: the served model)


def _site(site: str, layer: int, index: int) -> tuple[str, Any]:
    """The hook name and the index of one patch (as the sweeps of ``inspect.patching``)."""
    if site == "resid_pre":
        return f"blocks.{layer}.resid_pre", (slice(None), index)
    return f"blocks.{layer}.attn.z", (slice(None), slice(None), index)


class Interventions:
    """Patching sweeps of prompt pairs (each computed once) and ablated logits.

    ``model_at(step)`` is the model of a step (the served one for None; an APIError naming
    the kept steps for an unknown one), as the explorer's analyses use."""

    def __init__(self, state: ServeState, model_at: Callable[[int | None], Any]) -> None:
        self.state, self.model_at = state, model_at
        self.model, self.tok = state.model, state.tokenizer
        self.lock = state.scheduler.lock
        self.pairs: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
        self.pairs_lock = threading.Lock()

    def _ids(self, prompt: str, field: str, model: Any = None) -> list[int]:
        try:
            return encode_prompt(model or self.model, self.tok, prompt)
        except GlassError as e:
            raise APIError(400, f"{field}: {e}", param=field) from None

    def _pair(self, ask: Patch) -> dict[str, Any]:
        key = (ask.clean, ask.corrupted)
        with self.pairs_lock:
            if key in self.pairs:
                self.pairs.move_to_end(key)
                return self.pairs[key]
        clean, corrupted = self._ids(ask.clean, "clean"), self._ids(ask.corrupted, "corrupted")
        if len(clean) != len(corrupted):
            raise APIError(400, f"the clean prompt is {len(clean)} tokens and the corrupted "
                           f"prompt {len(corrupted)}: patching needs the same length",
                           param="corrupted")  # fmt: skip
        L = self.model.config.n_layers
        names = [f"blocks.{i}.{s}" for i in range(L) for s in ("resid_pre", "attn.z")]
        with self.lock, evaluating(self.model), torch.no_grad():
            clean_logits, cache = run_with_cache(self.model, clean, names)
            corrupted_logits = run_with_hooks(self.model, corrupted, {})
        pair = {"clean": clean, "corrupted": corrupted, "cache": cache,
                "clean_logits": clean_logits, "corrupted_logits": corrupted_logits,
                "sweeps": {}}  # fmt: skip
        with self.pairs_lock:
            self.pairs[key] = pair
            while len(self.pairs) > KEEP:
                self.pairs.popitem(last=False)
        return pair

    def _token(self, value: int | str | None, field: str, default: int) -> int:
        if value is None:
            return default
        if isinstance(value, str):
            ids = list(self.tok.encode(value))
            if len(ids) != 1:
                raise APIError(400, f"{field} {value!r} is {len(ids)} tokens, not one",
                               param=field)  # fmt: skip
            value = ids[0]
        if not 0 <= value < self.state.n_valid:
            raise APIError(400, f"{field} token {value} is outside the vocabulary "
                           f"[0, {self.state.n_valid})", param=field)  # fmt: skip
        return value

    def _answers(self, ask: Patch, pair: dict[str, Any]) -> tuple[int, int]:
        n = self.state.n_valid
        clean_top = pair["clean_logits"][0, -1, :n].argsort(descending=True)[:2].tolist()
        corrupted_top = pair["corrupted_logits"][0, -1, :n].argsort(descending=True)[:2].tolist()
        answer = self._token(ask.answer, "answer", clean_top[0])
        default_wrong = corrupted_top[0] if corrupted_top[0] != answer else corrupted_top[1]
        return answer, self._token(ask.wrong, "wrong", default_wrong)

    def _metric(self, pair: dict[str, Any], answer: int, wrong: int) -> Any:
        a, w = (visible(t) for t in token_texts(self.tok, [answer, wrong]))
        try:
            return normalised(logit_diff(answer, wrong, name=f"logit_diff('{a}', '{w}')"),
                              pair["clean_logits"], pair["corrupted_logits"])  # fmt: skip
        except GlassError as e:
            raise APIError(400, str(e), param="wrong") from None

    def example(self) -> dict[str, Any]:
        """The first of EXAMPLES whose prompts this tokenizer reads in equal numbers of tokens
        (within the context), else the first, which the page then explains when run."""
        for clean, corrupted in EXAMPLES:
            try:
                a, b = (encode_prompt(self.model, self.tok, p) for p in (clean, corrupted))
            except GlassError:  # e.g. a character a char model lacks
                continue
            if len(a) == len(b):
                return {"clean": clean, "corrupted": corrupted, "tokens": len(a)}
        clean, corrupted = EXAMPLES[0]
        return {"clean": clean, "corrupted": corrupted, "tokens": None}

    def patch(self, ask: Patch) -> dict[str, Any]:
        pair = self._pair(ask)
        answer, wrong = self._answers(ask, pair)
        metric = self._metric(pair, answer, wrong)
        if (answer, wrong) not in pair["sweeps"]:
            args = (self.model, pair["corrupted"], pair["cache"], metric)
            with self.lock:
                resid = get_act_patch_resid_pre(*args)  # [L, T]
                heads = get_act_patch_attn_head_out_all_pos(*args)  # [L, H]
            pair["sweeps"][(answer, wrong)] = (resid, heads)
        resid, heads = pair["sweeps"][(answer, wrong)]
        diff = logit_diff(answer, wrong)
        texts = token_texts(self.tok, [answer, wrong])
        return {
            "clean": token_texts(self.tok, pair["clean"]),
            "corrupted": token_texts(self.tok, pair["corrupted"]),
            "answer": {"id": answer, "text": texts[0]},
            "wrong": {"id": wrong, "text": texts[1]},
            "diff": {k: float(diff(pair[f"{k}_logits"])) for k in ("clean", "corrupted")},
            "small_gap": small_gap(
                *(float(diff(pair[f"{k}_logits"])) for k in ("clean", "corrupted"))
            ),
            "resid_pre": [[round(float(v), 5) for v in row] for row in resid],
            "heads": [[round(float(v), 5) for v in row] for row in heads],
        }

    def effect(self, ask: PatchCell) -> dict[str, Any]:
        pair = self._pair(ask)
        cfg = self.model.config
        n = len(pair["corrupted"]) if ask.site == "resid_pre" else cfg.n_heads
        if not (0 <= ask.layer < cfg.n_layers and 0 <= ask.index < n):
            what = "position" if ask.site == "resid_pre" else "head"
            raise APIError(400, f"no {ask.site} patch at layer {ask.layer}, {what} {ask.index} "
                           f"({cfg.n_layers} layers × {n})", param="index")  # fmt: skip
        answer, wrong = self._answers(ask, pair)
        metric = self._metric(pair, answer, wrong)
        name, index = _site(ask.site, ask.layer, ask.index)
        hooks = {name: patch_hook(pair["cache"][name], index)}
        with self.lock, evaluating(self.model), torch.no_grad():
            patched = run_with_hooks(self.model, pair["corrupted"], hooks)
        nv = self.state.n_valid
        probs = {k: torch.softmax(z[0, -1, :nv].float(), -1) for k, z in
                 (("clean", pair["clean_logits"]), ("corrupted", pair["corrupted_logits"]),
                  ("patched", patched))}  # fmt: skip
        shown = list(dict.fromkeys([*probs["patched"].topk(TOP).indices.tolist(), answer, wrong]))
        shown.sort(key=lambda i: -float(probs["patched"][i]))
        texts = token_texts(self.tok, shown)
        rows = [{"id": i, "text": s, **{k: round(float(p[i]), 6) for k, p in probs.items()}}
                for i, s in zip(shown, texts)]  # fmt: skip
        return {"site": ask.site, "layer": ask.layer, "index": ask.index,
                "value": float(metric(patched)), "answer": answer, "wrong": wrong,
                "rows": rows}  # fmt: skip

    def ablate(self, ask: Ablate) -> dict[str, Any]:
        model = self.model_at(ask.step)
        cfg = model.config
        for layer, head in ask.heads:
            if not (0 <= layer < cfg.n_layers and 0 <= head < cfg.n_heads):
                raise APIError(400, f"no head L{layer}H{head} in a model of {cfg.n_layers} "
                               f"layers × {cfg.n_heads} heads", param="heads")  # fmt: skip
        ids = self._ids(ask.prompt, "prompt", model)
        p = len(ids) - 1 if ask.pos is None else ask.pos
        if not 0 <= p < len(ids):
            raise APIError(400, f"pos {p} is outside the prompt's {len(ids)} tokens", param="pos")
        heads = sorted({(layer, head) for layer, head in ask.heads})
        with self.lock, evaluating(model), torch.no_grad():
            z = run_with_hooks(model, ids, ablation_hooks(model, heads=heads))
        logits = z[0, p, : self.state.n_valid].to(torch.float32)
        return {"pos": p, "heads": [list(h) for h in heads], "logits": b64(logits),
                "step": ask.step}  # fmt: skip
