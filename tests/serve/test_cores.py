"""``serve.cores``: one OpenMP thread for one Python thread's PyTorch operations. Inside
``one_thread`` this thread's team is 1 and another thread's is not, also where PyTorch has
not yet looked at this thread's count (it would set its own); and the sampler gives the same
bits with a team of 1 as with PyTorch's own team (the scheduler samples inside
``one_thread``)."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import pytest
import torch

from glassgpt.sample.filters import SamplingConfig
from glassgpt.sample.rows import Rows
from glassgpt.serve import cores

pytestmark = pytest.mark.skipif(cores.runtime() is None, reason="no OpenMP runtime found")


@pytest.fixture(autouse=True)
def two_threads():
    """A team of 2 on this thread (an earlier test may have left PyTorch on 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_one_thread_is_this_threads_alone_and_restored() -> None:
    n = torch.get_num_threads()
    inside, other = [], []
    entered, checked = threading.Event(), threading.Event()

    def elsewhere() -> None:
        entered.wait(10)
        other.append(torch.get_num_threads())
        checked.set()

    t = threading.Thread(target=elsewhere)
    t.start()
    with cores.one_thread():
        inside.append(torch.get_num_threads())
        entered.set()
        checked.wait(10)
    t.join()
    assert inside == [1] and other == [n] and torch.get_num_threads() == n


def test_one_thread_holds_on_a_thread_pytorch_has_not_seen() -> None:
    """A new thread's first parallel PyTorch operation sets its count to PyTorch's own (2
    here) unless PyTorch looked at the thread before the 1 was set (as the prompt thread's
    first forward did to a 1 set in its initializer)."""
    seen: list[int] = []

    def fresh() -> None:
        with cores.one_thread():
            torch.softmax(torch.randn(8, 65, dtype=torch.float64), dim=-1)  # (parts its rows)
            seen.append(torch.get_num_threads())

    t = threading.Thread(target=fresh)
    t.start()
    t.join(10)
    assert seen == [1]


def test_sampling_on_one_thread_gives_the_teams_bits() -> None:
    B, V = 8, 5003
    settings = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_p=0.9),
                SamplingConfig(temperature=1.3, top_k=40), SamplingConfig(temperature=0.0),
                SamplingConfig(temperature=0.9, min_p=0.05, presence_penalty=0.5),
                SamplingConfig(temperature=1.1, repetition_penalty=1.2, top_p=0.5),
                SamplingConfig(temperature=0.8, frequency_penalty=0.3, top_k=7, top_p=0.95),
                SamplingConfig(temperature=1.0, logit_bias={3: 5.0})]  # fmt: skip
    torch.manual_seed(0)
    rows = [Rows(B, V), Rows(B, V)]
    for r in rows:
        for b, cfg in enumerate(settings):
            r.set(b, cfg, seed=b, history=[b, 2 * b, 17])
    for step in range(20):
        logits = torch.randn(B, V) * (0.5 + step % 4)
        team = rows[0].sample(logits)
        with cores.one_thread():
            alone = rows[1].sample(logits)
            probs = rows[1].probabilities(logits)
        assert torch.equal(team[0], alone[0]) and torch.equal(team[1], alone[1])
        assert torch.equal(rows[0].probabilities(logits), probs)


def test_the_runtime_is_pytorchs_where_other_wheels_bring_their_own() -> None:
    """scikit-learn's, CTranslate2's and sentencepiece's wheels bundle a libgomp of their
    own; with those loaded (as a whole test session loads them), a count set through
    ``runtime()`` still reaches PyTorch's team, and every other runtime's count is as it was."""
    site = Path(torch.__file__).resolve().parents[1]
    others = [p for p in site.glob("*.libs/libgomp*.so*") if p.is_file()]
    if not others:
        pytest.skip("no other wheel's libgomp installed here")
    loaded = [ctypes.CDLL(str(p)) for p in others]
    for lib in loaded:
        lib.omp_get_max_threads.restype = ctypes.c_int
    before = [lib.omp_get_max_threads() for lib in loaded]
    lib = cores.runtime.__wrapped__()  # (found anew, with the others mapped)
    assert lib is not None
    assert [other.omp_get_max_threads() for other in loaded] == before
    n = torch.get_num_threads()
    lib.omp_set_num_threads(1)
    try:
        assert torch.get_num_threads() == 1
    finally:
        lib.omp_set_num_threads(n)
