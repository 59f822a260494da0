"""What ``Rows`` keeps per row from ``set()`` rather than working out each step (log m_b for
min-p, the flag of a negative frequency or presence penalty): a row whose settings ``set()``
changed, or that ``move()`` moved, samples as a fresh sampler with its settings does; and a
mixed step's penalties and bias (NumPy on a CPU) are ``filters.apply_penalties`` /
``apply_bias`` bit for bit, ±0 included."""

from __future__ import annotations

import torch

from glassgpt.sample.filters import SamplingConfig, apply_bias, apply_penalties
from glassgpt.sample.rows import Rows

V = 64


def test_min_p_follows_set_and_move() -> None:
    """Row 2's min-p (log m_b, taken at set()) moves with it into row 0, whose own min-p it
    replaces; row 1, re-set without min-p, forgets its old one: rows 0 and 1 sampled as one
    batch draw what fresh one-row samplers with their settings draw."""
    tight, loose = SamplingConfig(min_p=0.6), SamplingConfig(temperature=1.5)
    rows = Rows(3, V)
    rows.set(0, loose, seed=7)
    rows.set(1, tight, seed=8)
    rows.set(1, loose, seed=8)  # settings changed: min-p off again
    rows.set(2, tight, seed=9)
    rows.move(2, 0)
    fresh = [Rows(1, V), Rows(1, V)]
    fresh[0].set(0, tight, seed=9)
    fresh[1].set(0, loose, seed=8)
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):
        z = torch.randn(2, V, generator=gen)
        got = rows.sample(z)[0].tolist()
        assert got == [int(fresh[b].sample(z[b : b + 1])[0][0]) for b in range(2)]


def test_penalties_and_bias_are_the_filters_bits_after_set_and_move() -> None:
    """A step's z after penalties and bias, row by row, is ``apply_penalties`` then
    ``apply_bias`` with that row's settings, bit for bit, whatever its batch mates (−0
    logits included: a negative frequency or presence penalty turns an unseen −0 into +0,
    a non-negative one keeps it, and so does a row without a bias beside one with), after
    rows were re-set from negative penalties to positive ones and back, and moved."""
    neg = SamplingConfig(frequency_penalty=-0.4, presence_penalty=0.5, repetition_penalty=1.1)
    pos = SamplingConfig(frequency_penalty=0.3, presence_penalty=0.5, logit_bias={3: 2.0})
    plain = SamplingConfig(frequency_penalty=0.3)  # no bias: its −0 stays beside a bias row's
    history = [1, 2, 2, 5]
    rows = Rows(5, V)
    rows.set(0, neg, 1, history)
    rows.set(1, pos, 2, history)
    rows.set(2, pos, 3, history)
    rows.set(2, neg, 3, history)  # positive, then negative
    rows.set(3, neg, 4, history)
    rows.set(3, pos, 4, history)  # negative, then positive
    rows.set(4, plain, 5, history)
    rows.move(0, 1)  # row 1: neg now
    want_cfg = [neg, neg, neg, pos, plain]
    z = 2 * torch.randn(5, V, generator=torch.Generator().manual_seed(0))
    z[:, 10:14] = -0.0  # unseen ids at −0
    z[:, 1] = -0.0  # a seen one
    for start, width in ((0, 5), (2, 3), (3, 2), (4, 1)):
        got = rows._process(z[start : start + width], start)[0]
        counts = torch.bincount(torch.tensor(history), minlength=V)[None]
        for b in range(width):
            cfg = want_cfg[start + b]
            want = apply_penalties(z[start + b : start + b + 1], counts, cfg.repetition_penalty,
                                   cfg.frequency_penalty, cfg.presence_penalty)  # fmt: skip
            want = apply_bias(want, cfg.logit_bias)
            assert torch.equal(got[b].view(torch.int32), want[0].view(torch.int32)), (start, b)
