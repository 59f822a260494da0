"""A replayed step run as one compiled call (glassgpt.kernels.program, ``kernels/_program.c``):
its logits and KV caches equal the eager step's and the Python loop's over the same recorded
calls, bit for bit, step after step, for every kernel variant forced in turn (AVX-512, AVX2,
portable; int8's and int4's own), on float32, bf16, int8 and int4 weights and the families'
tiny models; a server's per-row lengths; a soft cap's PyTorch call made from Python between
two compiled segments; an error inside an implementation raising what the kernel's entry
point raises."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from glassgpt import kernels
from glassgpt.model import GPT
from glassgpt.model.gpt import TokenError
from glassgpt.model.precision import decoding_copy
from glassgpt.sample.cache import KVCache
from glassgpt.sample.replay import ReplayedStep
from glassgpt.serve.slots import SlotCache

from .test_replay import model_of, prefilled
from .test_replay_families import FAMILIES

_gemv, _rowwise = kernels.extension("_gemv"), kernels.extension("_rowwise")
_int8, _int4 = kernels.extension("_int8"), kernels.extension("_int4")
pytestmark = pytest.mark.skipif(
    not kernels.built("_program") or _gemv is None or _rowwise is None,
    reason="glassgpt's kernels are not built",
)


def _force(variant: str) -> None:
    """Every extension's kernels forced to ``variant`` ("widest": each one's best)."""
    portable = variant == "portable"
    _gemv.use_portable(portable)
    _gemv.wide_registers(variant == "widest")
    _rowwise.use_portable(portable)
    if _int8 is not None:
        _int8.use_portable(portable)
        if not portable:
            _int8.wide_registers(variant == "widest")
    if _int4 is not None:
        names = _int4.kernels()
        want = {"widest": names[0], "avx2": "avx2", "portable": "scalar"}[variant]
        _int4.use(want if want in names else None)


@pytest.fixture(params=["widest", "avx2", "portable"])
def variant(request: pytest.FixtureRequest) -> Iterator[str]:
    _force(request.param)
    yield request.param
    _force("widest")


def _decoding(model: GPT, dtype: str) -> GPT:
    """A bf16 model's float32-activation copy (what the engine decodes), else the model."""
    copy = decoding_copy(model) if dtype == "bf16" else None
    return copy[0] if copy is not None else model


def three_ways(model: GPT, batch: int = 2, steps: int = 8) -> ReplayedStep:
    """Record a step on each of two caches (the first replays through its program, the second
    through the Python loop) and step both beside eager steps on a third: every logit and
    every cache entry equal, bit for bit. Returns the programmed step."""
    g = torch.Generator().manual_seed(1)
    V = model.config.n_vocab
    prompt = torch.randint(0, V, (batch, 5), generator=g)
    caches = [prefilled(model, prompt) for _ in range(3)]
    first = torch.randint(0, V, (batch, 1), generator=g)
    compiled, _ = ReplayedStep.record(model, caches[0], first)
    looped, _ = ReplayedStep.record(model, caches[1], first)
    assert compiled is not None and looped is not None, ReplayedStep.why_not
    assert compiled.program is not None
    looped.program = None  # the Python loop over the same kinds of calls
    with torch.inference_mode():
        model(first, cache=caches[2])
        for _ in range(steps):
            tokens = torch.randint(0, V, (batch, 1), generator=g)
            a, b = compiled(tokens).clone(), looped(tokens).clone()
            c = model(tokens, cache=caches[2])
            assert torch.equal(a, c) and torch.equal(b, c)
    assert caches[0].length == caches[1].length == caches[2].length == 6 + steps
    for x, y, z in zip(*(c.layers for c in caches)):
        assert torch.equal(x.k, z.k) and torch.equal(x.v, z.v)
        assert torch.equal(y.k, z.k) and torch.equal(y.v, z.v)
    return compiled


@pytest.mark.parametrize("dtype", ["float32", "bf16", "int8", "int4"])
def test_the_program_is_the_eager_step_for_every_variant(variant: str, dtype: str) -> None:
    model = _decoding(model_of(dtype), dtype)
    step = three_ways(model)
    assert None not in step.program.names  # every call compiled: one GIL release a step
    assert step.program.names == [fn.__name__ for fn, _, _ in step.calls]


@pytest.mark.parametrize("dtype", ["float32", "bf16", "int8", "int4"])
@pytest.mark.parametrize("name", ["llama-gqa-2to1", "qwen3-qknorm", "gemma-gains-sandwich",
                                  "neox-partial-parallel", "mistral-window"])  # fmt: skip
def test_the_families_programs_are_their_eager_steps(name: str, dtype: str) -> None:
    model = _decoding(model_of(dtype, **FAMILIES[name]), dtype)
    step = three_ways(model, steps=6)
    assert None not in step.program.names  # RoPE, SwiGLU's fused product, GQA, scale_many


def test_a_soft_cap_is_a_python_call_between_compiled_segments() -> None:
    model = model_of(**FAMILIES["gemma2-softcaps-window"])
    step = three_ways(model, steps=6)
    names = step.program.names
    assert names.count(None) == 3  # the final cap's c · tanh(z / c): PyTorch's kernels
    assert names[-1] is None and names[0] == "embed"


def test_a_servers_rows_each_at_its_own_length() -> None:
    """Per-row lengths (a SlotCache): the program reads them when it runs, as the loop does,
    and advances them."""
    model = model_of(**FAMILIES["qwen3-qknorm"])
    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, 61, (n,), generator=g).tolist() for n in (3, 11, 1)]
    slots = [SlotCache.for_model(model, slots=4) for _ in range(2)]
    with torch.inference_mode():
        for cache in slots:
            for b, s in enumerate(seqs):
                pre = KVCache.for_model(model, 1, len(s))
                model(torch.tensor([s]), cache=pre)
                cache.load(b, pre)
        first = torch.randint(0, 61, (3, 1), generator=g)
        compiled, _ = ReplayedStep.record(model, slots[0], first)
        looped, _ = ReplayedStep.record(model, slots[1], first)
    assert compiled is not None and looped is not None, ReplayedStep.why_not
    looped.program = None
    for _ in range(5):
        ids = torch.randint(0, 61, (3,), generator=g).tolist()
        assert torch.equal(compiled(ids), looped(ids))
    assert slots[0].lengths[:3].tolist() == [n + 6 for n in (3, 11, 1)]
    assert torch.equal(slots[0].lengths, slots[1].lengths)
    for x, y in zip(slots[0].layers, slots[1].layers):
        assert torch.equal(x.k, y.k) and torch.equal(x.v, y.v)


def test_an_id_out_of_range_raises_the_kernels_message() -> None:
    model = model_of()
    caches = [prefilled(model, torch.zeros(1, 3, dtype=torch.long)) for _ in range(2)]
    steps = [ReplayedStep.record(model, c, torch.zeros(1, 1, dtype=torch.long))[0] for c in caches]
    steps[1].program = None
    messages = []
    for step in steps:
        with pytest.raises(TokenError) as e:
            step([61])
        messages.append(str(e.value))
    assert messages[0] == messages[1] == "tokens: id 61 is out of range [0, 61) for n_vocab=61"


def test_an_error_inside_the_program_is_the_entry_points_exception() -> None:
    """Bad sizes past the recording: the same exception type and message as the call made
    from Python, and the compiled calls before it have run."""
    x, y = torch.ones(4), torch.zeros(4)
    out = torch.zeros(4)
    add = (_rowwise.add, (x.data_ptr(), x.data_ptr(), out.data_ptr(), 4), ())
    cases = [
        (_rowwise.norm, (x.data_ptr(), x.data_ptr(), 0, y.data_ptr(), 1, 0, 1e-5, True)),
        (_gemv.gemv_panels, (x.data_ptr(), x.data_ptr(), 0, y.data_ptr(), 99, 4, 4, 1)),
        (_rowwise.gelu_many, (x.data_ptr(), 0, y.data_ptr(), -1, 1, 0)),
        (kernels.extension("_attend").attend,
         (0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, (0,) * 20, 1)),
    ]  # fmt: skip
    for fn, args in cases:
        with pytest.raises(Exception) as direct:
            fn(*args)
        out.zero_()
        program = kernels.compile_calls([add, (fn, args, ())])
        assert program is not None and program.names == ["add", fn.__name__]
        with pytest.raises(type(direct.value)) as inside:
            program(0)
        assert str(inside.value) == str(direct.value)
        assert torch.equal(out, x + x)  # the call before it ran


def test_positions_move_only_the_named_arguments() -> None:
    """take_rows at position n (argument 4) from a table: row n each run."""
    table = torch.arange(12.0).view(6, 2)
    y = torch.zeros(2)
    program = kernels.compile_calls(
        [(_rowwise.take_rows, (table.data_ptr(), y.data_ptr(), 1, 2, 1, 0), (4,))]
    )
    for n in range(5):
        program(n)
        assert torch.equal(y, table[n + 1])


def test_without_the_extension_the_loop_replays() -> None:
    with kernels.hidden("_program"):
        assert kernels.compile_calls([]) is None
        model = model_of()
        three_ways_loop = prefilled(model, torch.zeros(1, 3, dtype=torch.long))
        step, _ = ReplayedStep.record(model, three_ways_loop, torch.zeros(1, 1, dtype=torch.long))
        assert step is not None and step.program is None
        eager = prefilled(model, torch.zeros(1, 4, dtype=torch.long))
        with torch.inference_mode():
            for t in range(1, 4):
                tokens = torch.tensor([[t]])
                assert torch.equal(step(tokens), model(tokens, cache=eager))


def test_a_python_calls_positions_move_on_a_fresh_tuple_each_run() -> None:
    """A call without a C implementation gets its positional arguments + n, every run from
    the recorded values (not from the last run's)."""
    seen: list[tuple[int, ...]] = []
    program = kernels.compile_calls([(lambda *a: seen.append(a), (10, 20, 30), (0, 2))])
    assert program is not None and program.names == [None]
    for n in (3, 3, 5):
        program(n)
    assert seen == [(13, 20, 33), (13, 20, 33), (15, 20, 35)]
