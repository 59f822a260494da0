"""``glassgpt inspect``'s static page carries the same readable logit-lens table as the explorer."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
import torch

from glassgpt.inspect.lens import logit_lens
from glassgpt.inspect.report import build_report, encode_prompt
from glassgpt.tokenizer.display import token_texts


@pytest.mark.slow
def test_static_report_has_the_lens_table(oracle: Any) -> None:
    model, tok = oracle
    prompt = "abc abd abc"
    html = build_report(model, tok, prompt, seq_len=4)
    table = html[html.index('<table class="heat">') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr><th>([^<]+)</th>(.*?)</tr>", table)  # the header row has no name
    assert [name for name, _ in rows] == ["embed", "after L0", "after L1"]
    ids = encode_prompt(model, tok, prompt)
    probs = logit_lens(model, ids).probs()[:, 0]  # [L + 1, T, V]
    for r, (_, cells) in enumerate(rows):
        got = re.findall(r"<td[^>]*>(.*?)<small>(\d+)%</small></td>", cells, flags=re.S)
        assert len(got) == len(ids)
        for t, (text, pct) in enumerate(got):
            p, best = torch.max(probs[r, t], -1)
            assert unescape(text) == token_texts(tok, [int(best)])[0]
            assert int(pct) == round(100 * float(p))
