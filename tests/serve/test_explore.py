"""The explorer's JSON against independent computations on the same checkpoint."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import torch
from tests.serve.conftest import Server, request

from glassgpt.model import GPT, GPTConfig


def test_explorer_lens_equals_logit_lens() -> None:
    from glassgpt.inspect.cache import run_with_cache
    from glassgpt.inspect.lens import logit_lens
    from glassgpt.serve.explore import lens_top

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_vocab=37, n_ctx=16, d_model=16, n_layers=3, n_heads=2)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    ids = torch.randint(0, 37, (12,)).tolist()
    lens = logit_lens(model, ids)
    want_p, want_i = lens.top(3)  # [L + 1, 1, T, 3]
    _, acts = run_with_cache(model, ids, lens.names)
    with torch.no_grad():
        got_p, got_i = lens_top(model, torch.stack([acts[n][0] for n in lens.names]), 3)
    assert torch.equal(got_i, want_i[:, 0])
    torch.testing.assert_close(got_p, want_p[:, 0], atol=1e-6, rtol=1e-5)


def test_logits_and_attribution_are_the_models(live: Server, oracle: Any) -> None:
    model, tok = oracle
    prompt = "abc abd ab"
    ids = tok.encode(prompt)
    with torch.no_grad():
        want = model(torch.tensor([ids]))[0]  # [T, V]
    status, d = request(live.url, "/api/logits", {"prompt": prompt, "pos": 3})
    assert status == 200 and d["pos"] == 3
    got = np.frombuffer(base64.b64decode(d["logits"]), dtype=np.float32)
    np.testing.assert_allclose(got, want[3].numpy(), atol=1e-4)
    token = int(want[5].argsort()[-2])  # the second most likely token after position 5
    status, d = request(live.url, "/api/attribution", {"prompt": prompt, "pos": 5, "token": token})
    assert status == 200 and d["token"] == token
    assert abs(d["logit"] - float(want[5, token])) < 1e-4
    assert abs(sum(b["value"] for b in d["bars"]) - d["logit"]) < 1e-3
    assert abs(d["total"] - d["logit"]) < 1e-3


def test_analysis_patterns_are_causal_distributions(live: Server) -> None:
    status, d = request(live.url, "/api/analyze", {"prompt": "hello hello"})
    assert status == 200
    L, H, T, _ = d["shape"]
    p = np.frombuffer(base64.b64decode(d["patterns"]), dtype=np.uint8).reshape(L, H, T, T) / 255
    assert np.all(np.triu(p, k=1) == 0)  # no query sees a later key
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=T / 255)  # rows sum to 1 (8-bit rounding)
    assert [t["text"] for t in d["tokens"]] == list("hello hello")
    assert len(d["lens"]) == L + 1 and all(len(r["cells"]) == T for r in d["lens"])


CLEAN, CORRUPTED = "ab ab ab ab", "ab ab cd ab"  # char tokens: 11 each, 2 differ


def test_patch_heatmaps_equal_patching(live: Server, oracle: Any) -> None:
    """The sweeps of ``inspect.patching``, and each cell by hand: one forward of the corrupted
    prompt with one clean activation put in."""
    from glassgpt.inspect.cache import run_with_cache
    from glassgpt.inspect.metrics import logit_diff, normalised
    from glassgpt.inspect.patching import (
        get_act_patch_attn_head_out_all_pos,
        get_act_patch_resid_pre,
    )

    model, tok = oracle
    clean, corrupted = tok.encode(CLEAN), tok.encode(CORRUPTED)
    status, d = request(live.url, "/api/patch", {"clean": CLEAN, "corrupted": CORRUPTED})
    assert status == 200, d
    with torch.no_grad():
        clean_logits, cache = run_with_cache(model, clean, ["resid_pre", "z"])
        corrupted_logits = model(torch.tensor([corrupted]))
    answer, wrong = d["answer"]["id"], d["wrong"]["id"]
    assert answer == int(clean_logits[0, -1].argmax())  # the defaults: each run's top token
    first, second = corrupted_logits[0, -1].argsort(descending=True)[:2].tolist()
    assert wrong == (first if first != answer else second)
    metric = normalised(logit_diff(answer, wrong), clean_logits, corrupted_logits)
    direct = get_act_patch_resid_pre(model, corrupted, cache, metric)
    np.testing.assert_allclose(d["resid_pre"], direct.numpy(), atol=1e-4)
    direct = get_act_patch_attn_head_out_all_pos(model, corrupted, cache, metric)
    np.testing.assert_allclose(d["heads"], direct.numpy(), atol=1e-4)

    def patched(name: str, fn: Any) -> float:
        with torch.no_grad(), model.hooks({name: fn}):
            return float(metric(model(torch.tensor([corrupted]))))

    def put(name: str, where: Any) -> Any:
        def hook(t: torch.Tensor, _: str) -> torch.Tensor:
            t = t.clone()
            t[where] = cache[name][where]
            return t

        return hook

    L, H, T = model.config.n_layers, model.config.n_heads, len(clean)
    want = [[patched(f"blocks.{l}.resid_pre", put(f"blocks.{l}.resid_pre", (0, t)))
             for t in range(T)] for l in range(L)]  # fmt: skip
    np.testing.assert_allclose(d["resid_pre"], want, atol=1e-4)
    want = [[patched(f"blocks.{l}.attn.z", put(f"blocks.{l}.attn.z", (0, slice(None), h)))
             for h in range(H)] for l in range(L)]  # fmt: skip
    np.testing.assert_allclose(d["heads"], want, atol=1e-4)
    same = [a == b for a, b in zip(clean, corrupted)]
    assert all(abs(v) < 1e-5 for v, s in zip(d["resid_pre"][0], same) if s)  # nothing changed

    # one cell's effect: the same normalised value, and distributions that are softmaxes
    status, e = request(live.url, "/api/patch/effect", {"clean": CLEAN, "corrupted": CORRUPTED,
                        "site": "head", "layer": 1, "index": 2})  # fmt: skip
    assert status == 200, e
    assert abs(e["value"] - d["heads"][1][2]) < 1e-4
    p = torch.softmax(clean_logits[0, -1], -1)
    for row in e["rows"]:
        assert abs(row["clean"] - float(p[row["id"]])) < 1e-5
    assert {answer, wrong} <= {r["id"] for r in e["rows"]}


def test_patch_refuses_what_it_cannot_patch(live: Server) -> None:
    status, d = request(live.url, "/api/patch", {"clean": "ab ab", "corrupted": "ab abc"})
    msg = d["error"]["message"]
    assert status == 400 and "5 tokens" in msg and "6" in msg and "\n" not in msg
    for answer in (10**6, "abc"):  # out of the vocabulary; text of three tokens
        status, d = request(live.url, "/api/patch", {"clean": CLEAN, "corrupted": CORRUPTED,
                            "answer": answer})  # fmt: skip
        assert status == 400 and str(answer) in d["error"]["message"]
    status, d = request(live.url, "/api/patch/effect", {"clean": CLEAN, "corrupted": CORRUPTED,
                        "site": "resid_pre", "layer": 0, "index": 11})  # fmt: skip
    assert status == 400 and "11" in d["error"]["message"]
    status, d = request(live.url, "/api/patch", {"clean": CLEAN, "corrupted": CLEAN})
    msg = d["error"]["message"]
    assert status == 400 and "on both the clean and the corrupted run" in msg
    assert msg.startswith("cannot normalise logit_diff('")  # named by the tokens' text, not ids


def test_patch_says_whether_the_runs_differ_enough(live: Server, oracle: Any) -> None:
    """``small_gap`` of the metric on the clean and corrupted runs, as ``glassgpt patch`` notes."""
    from glassgpt.inspect.metrics import small_gap

    status, d = request(live.url, "/api/patch", {"clean": CLEAN, "corrupted": CORRUPTED})
    assert status == 200, d
    assert d["small_gap"] is small_gap(d["diff"]["clean"], d["diff"]["corrupted"])


def test_ablated_logits_equal_a_model_without_those_heads(live: Server, oracle: Any) -> None:
    """``inspect.ablation``'s zero ablation, and independently: zeroing z[:, :, h] is zeroing
    W_O[h] (b_O stays) in a copy of the model."""
    import copy

    from glassgpt.inspect.ablation import ablation_hooks
    from glassgpt.inspect.cache import run_with_hooks

    model, tok = oracle
    heads = [[0, 1], [1, 3]]
    prompt = "abc abd ab"
    status, d = request(live.url, "/api/ablate", {"prompt": prompt, "pos": 4, "heads": heads})
    assert status == 200, d
    cut = copy.deepcopy(model)
    with torch.no_grad():
        for l, h in heads:
            cut.blocks[l].attn.W_O[h] = 0.0
        want = cut(torch.tensor([tok.encode(prompt)]))[0, 4]
        whole = model(torch.tensor([tok.encode(prompt)]))[0, 4]
        hooked = run_with_hooks(model, tok.encode(prompt), ablation_hooks(model, heads=heads))
    got = np.frombuffer(base64.b64decode(d["logits"]), dtype=np.float32)
    np.testing.assert_allclose(got, hooked[0, 4].numpy(), atol=1e-5)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-4)
    assert np.abs(got - whole.numpy()).max() > 1e-3  # the ablation changed something
    status, d = request(live.url, "/api/ablate", {"prompt": prompt, "heads": [[0, 9]]})
    assert status == 400 and "L0H9" in d["error"]["message"]
