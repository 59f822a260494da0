"""glassgpt on a CUDA GPU: training precisions, no host sync in the step, checkpoints that
move between the GPU and the CPU, sampling and inspection equal to the CPU, torchrun with
NCCL, and the memory pre-check. Every test skips without CUDA (CI has none); run them on a
GPU machine with ``python -m pytest -m gpu tests/test_gpu.py``.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glassgpt.cli import main
from glassgpt.model import GPT, GPTConfig
from glassgpt.train.config import TrainConfig
from glassgpt.train.distributed import DistContext
from glassgpt.train.metrics import read_metrics
from glassgpt.train.trainer import Trainer, TrainingDiverged

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)"),
]

REPO = Path(__file__).resolve().parents[1]
CUDA = torch.device("cuda")
SMALL = GPTConfig(n_vocab=96, n_ctx=32, d_model=64, n_layers=2, n_heads=4)


class Fixed(itertools.repeat):
    """One batch forever: ``Fixed((x, y))`` is a BatchSource with nothing to save."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@pytest.fixture(autouse=True)
def exact_float32():
    """TF32 off, as CPU float32 is compared; restored afterwards."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def batch(seed: int = 0, B: int = 8, T: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, SMALL.n_vocab, (B, T + 1), generator=g)
    return rows[:, :-1], rows[:, 1:]


def trainer_on(device: torch.device, precision: str, model: GPT, **cfg: object) -> Trainer:
    x, y = batch()
    train = TrainConfig(max_steps=100, batch_size=8, lr=1e-3, warmup_steps=0, progress=False,
                        precision=precision, compile=False, **cfg)  # type: ignore[arg-type]  # fmt: skip
    return Trainer(model, train, Fixed((x, y)), ctx=DistContext(device=device), log=lambda m: None)


def losses(trainer: Trainer, n: int) -> list[float]:
    return [trainer.train_step()["loss"] for _ in range(n)]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_training_step_in_low_precision_follows_float32_on_the_cpu(precision: str) -> None:
    torch.manual_seed(0)
    model = GPT(SMALL)
    w0 = model.blocks[0].attn.W_Q.detach().clone()
    cpu = trainer_on(torch.device("cpu"), "fp32", copy.deepcopy(model))
    gpu = trainer_on(CUDA, precision, model)
    assert (gpu.scaler is not None) == (precision == "fp16")  # fp16 needs a GradScaler
    ref, got = losses(cpu, 5), losses(gpu, 5)
    assert got[0] == pytest.approx(ref[0], rel=1e-2)  # the same function before any update
    assert got[-1] < got[0]  # it learns the repeated batch
    if gpu.scaler is None:
        assert got == pytest.approx(ref, rel=2e-2)
        moved_cpu = cpu.model.blocks[0].attn.W_Q.detach() - w0
        moved_gpu = gpu.model.blocks[0].attn.W_Q.detach().cpu() - w0
        cos = torch.nn.functional.cosine_similarity(moved_gpu.flatten(), moved_cpu.flatten(), 0)
        assert cos > 0.9  # the same direction of travel
    else:  # a GradScaler may skip its first steps while it finds its scale
        assert torch.isfinite(torch.tensor(gpu.scaler.get_scale()))


def test_float32_training_on_the_gpu_equals_the_cpu() -> None:
    torch.manual_seed(0)
    model = GPT(SMALL)
    cpu = trainer_on(torch.device("cpu"), "fp32", copy.deepcopy(model))
    gpu = trainer_on(CUDA, "fp32", model)
    assert losses(gpu, 4) == pytest.approx(losses(cpu, 4), rel=1e-4)


def test_the_training_step_never_waits_for_the_gpu(tmp_path: Path) -> None:
    from glassgpt.data import BatchSampler

    tokens = torch.randint(0, SMALL.n_vocab, (50_000,), generator=torch.Generator().manual_seed(1))
    import numpy as np

    from glassgpt.data.shards import TokenStream

    path = tmp_path / "train_000.bin"
    tokens.numpy().astype(np.uint16).tofile(path)
    stream = TokenStream([path], np.dtype("<u2"))
    torch.manual_seed(0)
    sampler = BatchSampler(stream, batch_size=8, seq_len=32, seed=0, device=CUDA)
    for precision in ("bf16", "fp16"):
        train = TrainConfig(max_steps=100, batch_size=8, grad_accum=2, warmup_steps=0,
                            progress=False, precision=precision, compile=False)  # fmt: skip
        trainer = Trainer(GPT(SMALL), train, sampler, ctx=DistContext(device=CUDA))
        trainer.launch_step().result()  # warm-up: kernels loaded, pinned buffers cached
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            pending = [trainer.launch_step() for _ in range(3)]
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert all(0 < p.result()["loss"] < 10 for p in pending)


def test_a_nan_loss_on_the_gpu_leaves_the_weights_and_stops() -> None:
    torch.manual_seed(0)
    model = GPT(SMALL)
    trainer = trainer_on(CUDA, "bf16", model)
    trainer.train_step()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    forward = model.forward

    def poisoned(*args, **kwargs):  # type: ignore[no-untyped-def]
        logits, loss = forward(*args, **kwargs)
        return logits, loss * float("nan")

    model.forward = poisoned  # type: ignore[method-assign]
    pending = trainer.launch_step()  # step 2: the update is skipped on the device
    with pytest.raises(TrainingDiverged, match="nan at step 2"):
        trainer._checked(pending)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def tiny_run(tmp_path: Path, *overrides: str, out: Path | None = None) -> list[str]:
    """``glassgpt train`` arguments for a tiny character model on generated code."""
    text = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(3000))
    data = tmp_path / "input.txt"
    data.write_text(text, encoding="utf-8")
    return [
        "--preset", "cpu-tiny", "--data", str(data), "--set", "train.progress=false",
        "train.precision=fp32", "train.tf32=false", "train.compile=false",
        "train.eval_every=4", "train.eval_batches=2", "train.sample_tokens=0",
        "train.checkpoint_every=4", "train.keep_last=10", "train.warmup_steps=2",
        "train.decay_steps=12", *overrides,
    ] + (["--out", str(out)] if out else [])  # fmt: skip


def step_losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl")}


def test_a_checkpoint_moves_between_gpu_and_cpu_with_the_same_losses(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu"
    assert (
        main(["train", *tiny_run(tmp_path, "train.max_steps=12", "train.device=cuda", out=gpu)])
        == 0
    )
    reference = step_losses(gpu)
    assert sorted(reference) == list(range(1, 13))
    # GPU checkpoint at step 4 → the CPU to step 8
    cpu = tmp_path / "cpu"
    shutil.copytree(gpu, cpu)
    for step in (8, 12):
        shutil.rmtree(cpu / "ckpt" / f"step_{step:06d}")
    shutil.rmtree(cpu / "ckpt" / "best", ignore_errors=True)
    args = ["train", "--resume", str(cpu), "--set", "train.device=cpu", "train.max_steps=8"]
    assert main(args) == 0
    on_cpu = step_losses(cpu)
    for s in range(5, 9):
        assert on_cpu[s] == pytest.approx(reference[s], rel=1e-4), s
    # the CPU's step-8 checkpoint → back on the GPU to step 12
    args = ["train", "--resume", str(cpu), "--set", "train.device=cuda", "train.max_steps=12"]
    assert main(args) == 0
    back = step_losses(cpu)
    for s in range(9, 13):
        assert back[s] == pytest.approx(reference[s], rel=1e-4), s
    info = json.loads((cpu / "run.json").read_text())
    assert info["device"].startswith("cuda") and info["device_name"] == torch.cuda.get_device_name()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("trained")
    out = tmp / "run"
    assert main(["train", *tiny_run(tmp, "train.max_steps=60", "train.device=cuda", out=out)]) == 0
    return out


def test_sampling_on_the_gpu_equals_the_cpu(trained: Path, capsys: pytest.CaptureFixture) -> None:
    import glassgpt
    from glassgpt.sample import generate

    cpu_model, tok = glassgpt.load(trained)
    gpu_model, _ = glassgpt.load(trained, device="cuda")
    ids = tok.encode("def f12(x):\n")
    logits_cpu = cpu_model(torch.tensor([ids]))
    logits_gpu = gpu_model(torch.tensor([ids], device=CUDA)).cpu()
    assert torch.allclose(logits_gpu, logits_cpu, atol=1e-4, rtol=1e-4)
    greedy = {"max_new_tokens": 40, "temperature": 0}
    assert generate(gpu_model, ids, **greedy) == generate(cpu_model, ids, **greedy)
    drawn = {"max_new_tokens": 40, "temperature": 0.9, "top_k": 20, "seed": 3}
    assert generate(gpu_model, ids, **drawn) == generate(cpu_model, ids, **drawn)
    capsys.readouterr()
    args = ["sample", "--checkpoint", str(trained), "--prompt", "def ", "--seed", "1"]
    args += ["--max-new-tokens", "30"]
    assert main([*args, "--device", "cuda"]) == 0
    on_gpu = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == on_gpu


def test_inspection_on_the_gpu_equals_the_cpu(trained: Path, tmp_path: Path) -> None:
    import glassgpt
    from glassgpt.inspect.cache import run_with_cache

    cpu_model, tok = glassgpt.load(trained)
    gpu_model, _ = glassgpt.load(trained, device="cuda")
    ids = tok.encode("def f3(x):\n    return x")
    _, cache_cpu = run_with_cache(cpu_model, ids)
    _, cache_gpu = run_with_cache(gpu_model, ids)
    assert set(cache_gpu) == set(cache_cpu)
    for name in cache_cpu:
        assert torch.allclose(cache_gpu[name].cpu(), cache_cpu[name], atol=1e-4, rtol=1e-4), name
    page = tmp_path / "report.html"
    args = ["inspect", "--checkpoint", str(trained), "--prompt", "def f3(x):"]
    assert main([*args, "--output", str(page), "--device", "cuda"]) == 0
    assert page.stat().st_size > 10_000 and "Logit lens" in page.read_text("utf-8")


def test_torchrun_with_one_gpu_uses_nccl_and_ddp(tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    cmd += [
        "-m",
        "glassgpt",
        "train",
        *tiny_run(tmp_path, "train.max_steps=8", "train.device=cuda", out=out),
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads((out / "run.json").read_text())
    assert info["backend"] == "nccl" and info["world_size"] == 1
    single = tmp_path / "single"
    assert (
        main(["train", *tiny_run(tmp_path, "train.max_steps=8", "train.device=cuda", out=single)])
        == 0
    )
    ddp, plain = step_losses(out), step_losses(single)
    assert [ddp[s] for s in range(1, 9)] == pytest.approx([plain[s] for s in range(1, 9)], rel=1e-4)


def test_the_memory_check_refuses_a_batch_the_gpu_cannot_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    free, _ = torch.cuda.mem_get_info()
    big = ["model.n_ctx=1024", "model.d_model=1024", "model.n_layers=8", "model.n_heads=8"]
    big += [f"train.batch_size={max(512, int(free / 2**30) * 64)}"]  # far beyond the GPU
    args = ["train", *tiny_run(tmp_path, "train.device=cuda", *big, out=tmp_path / "big")]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert "needs about" in err and "free" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert torch.cuda.memory_allocated() < 2**30  # refused before the model was built


def test_decoding_from_a_cuda_graph_equals_eager_decoding() -> None:
    import warnings

    from glassgpt.sample import generate
    from glassgpt.sample.generation import ContextWarning

    torch.manual_seed(0)
    config = GPTConfig(n_vocab=96, n_ctx=48, d_model=64, n_layers=2, n_heads=4, positional="rope")
    for positional in ("learned", "rope"):
        model = GPT(config.replace(positional=positional)).to(CUDA).eval()
        prompts = [[1, 2, 3, 4, 5], [6], [7, 8, 9]]
        for opts in ({"temperature": 0}, {"temperature": 0.9, "top_k": 20, "seed": 3}):
            for rows in (prompts, prompts[0]):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ContextWarning)  # 100 > n_ctx: it slides
                    graphed = generate(model, rows, max_new_tokens=100, **opts)
                    eager = generate(model, rows, max_new_tokens=100, cuda_graph=False, **opts)
                assert graphed == eager, (positional, opts, rows)
