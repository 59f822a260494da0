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
