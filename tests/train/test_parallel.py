"""Training across processes and machines: two torchrun nodes (c10d rendezvous on 127.0.0.1)
against one process, FSDP (fully_shard over gloo on CPUs) against DDP, a checkpoint saved by
2 FSDP ranks resumed on 1, and its weights read by one process; plus the pieces one by one."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glassgpt import checkpoint as ckpt
from glassgpt.cli import main
from glassgpt.train.metrics import read_metrics
from glassgpt.train.optim import clip_gradients
from glassgpt.train.parallel import clip_sharded, torchrun_command

sys.path.insert(0, str(Path(__file__).parent))
from test_processes import SETS, env, glassgpt, text_file

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
STEPS = [*SETS, "train.max_steps=6", "train.batch_size=8", "train.eval_every=3"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(*cmds: list[str]) -> list[str]:
    """Run the commands at the same time (their start-up is most of their time); their stdout."""
    procs = [
        subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cmd in cmds
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return [out for out, _ in outs]


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl")}


def assert_same_losses(a: Path, b: Path, steps: range, tol: float = 1e-5) -> None:
    la, lb = losses(a), losses(b)
    assert [s for s in steps if s in la] == [s for s in steps if s in lb] == list(steps)
    for s in steps:
        assert lb[s] == pytest.approx(la[s], abs=tol), s


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same 6 steps (checkpoints at 3 and 6) by one process (``one``), by DDP on two
    torchrun nodes of one process each, node_rank 0 and 1 with a c10d rendezvous on 127.0.0.1
    (``nodes``), and by FSDP on two processes (``fsdp``); with the nodes' stdout."""
    tmp = tmp_path_factory.mktemp("parallel")
    base = ["--data", str(text_file(tmp)), "--set", *STEPS, "train.checkpoint_every=3"]
    out = {name: tmp / name for name in ("one", "nodes", "fsdp")}
    rdzv = ["--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=glassgpt-test"]  # fmt: skip
    node = ["-m", "glassgpt", *glassgpt(*base, "--out", str(out["nodes"]))[3:]]
    two = [*TORCHRUN, "--standalone", "--nproc_per_node=2", "-m", "glassgpt"]
    stdout = run(
        [*TORCHRUN, *rdzv, "--node_rank=0", *node],
        [*TORCHRUN, *rdzv, "--node_rank=1", *node],
        glassgpt(*base, "--out", str(out["one"])),
        [*two, *glassgpt(*base, "train.parallel=fsdp", "--out", str(out["fsdp"]))[3:]],
    )
    (tmp / "nodes.stdout").write_text("\n".join(stdout[:2]))
    return {**out, "tmp": tmp}


@pytest.mark.slow
def test_two_nodes_match_one_process(runs: dict[str, Path]) -> None:
    """Two nodes: the same losses as one process over the same global batch; run.json and
    the checkpoints written once, the closing line printed by global rank 0 alone."""
    assert_same_losses(runs["one"], runs["nodes"], range(1, 7))
    info = json.loads((runs["nodes"] / "run.json").read_text())
    assert info["world_size"] == 2 and info["backend"] == "gloo"
    assert (runs["tmp"] / "nodes.stdout").read_text().count("done: step 6") == 1
    folders = sorted(p.name for p in (runs["nodes"] / "ckpt").iterdir())
    assert folders == ["best", "latest", "step_000003", "step_000006"]  # no leftovers


@pytest.mark.slow
def test_fsdp_matches_ddp(runs: dict[str, Path]) -> None:
    """2 FSDP ranks (fully_shard over gloo) = 2 DDP ranks; the checkpoint's weights whole, its
    optimizer state one DCP shard file per rank."""
    assert_same_losses(runs["nodes"], runs["fsdp"], range(1, 7))
    saved = ckpt.load_checkpoint(runs["fsdp"] / "ckpt" / "step_000003")
    shards = [n for n in saved.state["files"] if n.startswith("optimizer/")]
    assert "optimizer/.metadata" in shards and len(shards) == 3  # metadata + one per rank
    assert "optimizer.safetensors" not in saved.files
    ddp = ckpt.load_checkpoint(runs["nodes"] / "ckpt" / "step_000003").tensors("model.safetensors")
    fsdp = saved.tensors("model.safetensors")
    assert set(ddp) == set(fsdp)
    for name in ddp:
        torch.testing.assert_close(fsdp[name], ddp[name], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_fsdp_checkpoint_resumes_on_one_rank_and_loads_in_one_process(
    runs: dict[str, Path],
) -> None:
    """The 2-rank FSDP step-3 checkpoint resumed by one FSDP rank and by one plain process:
    the same next losses; one process loads, samples from and exports its weights."""
    fsdp, tmp = runs["fsdp"], runs["tmp"]
    step3 = str(fsdp / "ckpt" / "step_000003")
    one_rank, plain = tmp / "one_rank", tmp / "plain"
    one = [*TORCHRUN, "--standalone", "--nproc_per_node=1", "-m", "glassgpt"]
    run(
        [*one, "train", "--resume", step3, "--out", str(one_rank)],
        [sys.executable, "-m", "glassgpt", "train", "--resume", step3, "--out", str(plain),
         "--set", "train.parallel=ddp"],
    )  # fmt: skip
    assert_same_losses(fsdp, one_rank, range(4, 7))
    assert_same_losses(fsdp, plain, range(4, 7))

    from glassgpt.checkpoint import load

    model, _ = load(fsdp)
    weights = ckpt.load_checkpoint(fsdp / "ckpt" / "step_000006").tensors("model.safetensors")
    assert set(weights) == set(model.state_dict())
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, weights[name], rtol=0, atol=0)
    assert main(["sample", "-c", str(fsdp), "-p", "line", "-m", "8", "--seed", "1"]) == 0
    assert main(["export", "-c", str(fsdp), "--format", "hf", "-o", str(tmp / "hf")]) == 0
    assert (tmp / "hf" / "model.safetensors").is_file()


def test_fsdp_without_a_process_group_shows_torchrun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = text_file(tmp_path)
    args = ["train", "--preset", "cpu-tiny", "--data", str(data), "--out", str(tmp_path / "r"),
            "--set", "train.parallel=fsdp", "train.max_steps=2"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "train.parallel" in err and "torchrun --nproc_per_node=" in err
    assert not (tmp_path / "r" / "ckpt").exists()


def test_unknown_parallel_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["train", "--preset", "cpu-tiny", "--data", str(text_file(tmp_path)),
            "--set", "train.parallel=zero3"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.parallel" in err and "zero3" in err


def test_torchrun_command_keeps_the_arguments() -> None:
    line = torchrun_command(["/x/glassgpt", "train", "--out", "my run", "--set", "a=b"], nproc=4)
    assert line == "torchrun --nproc_per_node=4 -m glassgpt train --out 'my run' --set a=b"


@pytest.mark.parametrize("max_norm", [1e-3, 0.5, 1e3])
def test_clip_sharded_in_one_process_is_the_plain_clip(max_norm: float) -> None:
    """Without a process group the shards are the whole gradients: the same norm and scaling
    as the trainer's clip (an independent sum: torch.linalg.vector_norm of all of them)."""
    g = torch.Generator().manual_seed(0)
    shapes = [(7, 3), (5,), (0,), (4, 4, 2)]
    a = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    b = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p, q in zip(a, b):
        p.grad = torch.randn(p.shape, generator=g)
        q.grad = p.grad.clone()
    expected = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in a]))
    norm_a = clip_sharded(a, max_norm)
    norm_b = clip_gradients(b, max_norm)
    assert float(norm_a) == pytest.approx(float(expected), rel=1e-6)
    assert float(norm_b) == pytest.approx(float(expected), rel=1e-6)
    for p, q in zip(a, b):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
    total = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in a]))
    assert float(total) <= max_norm * (1 + 1e-5)


def test_checkpoint_lists_and_checks_a_moved_folder(tmp_path: Path) -> None:
    """A folder written beside the checkpoint (optimizer shards) is moved in, every file
    checksummed; a changed byte in one is reported, and the checkpoint skipped on resume."""
    manager = ckpt.CheckpointManager(tmp_path / "ckpt")  # (it clears leftovers: first)
    tensors = {"model.safetensors": {"w": torch.ones(2)}}
    manager.save(1, tensors=tensors, files={}, state={})
    shards = tmp_path / "ckpt" / ".tmp-shards-step_000002"
    shards.mkdir(parents=True)
    (shards / ".metadata").write_bytes(b"meta")
    (shards / "__0_0.distcp").write_bytes(b"rank zero")
    folder = manager.save(2, tensors=tensors, files={}, state={}, folders={"optimizer": shards})
    assert not shards.exists()
    loaded = ckpt.load_checkpoint(folder)
    assert sorted(n for n in loaded.state["files"] if "/" in n) == [
        "optimizer/.metadata",
        "optimizer/__0_0.distcp",
    ]
    (folder / "optimizer" / "__0_0.distcp").write_bytes(b"rank zerO")
    with pytest.raises(ckpt.CheckpointError, match="checksum mismatch"):
        ckpt.load_checkpoint(folder)
    warnings: list[str] = []
    assert ckpt.find_resumable(tmp_path, warn=warnings.append).step == 1
    assert "__0_0.distcp" in warnings[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")
def test_fsdp_on_gpus_matches_ddp_in_bf16_and_resumes(tmp_path: Path) -> None:
    """On the GPUs (NCCL; two where there are two): FSDP with bf16 gathered parameters against
    DDP under bf16 autocast, and a resume from step 3 on the same ranks."""
    n = min(2, torch.cuda.device_count())
    sets = [*STEPS, "train.checkpoint_every=3", "train.precision=bf16", "train.device=cuda"]
    base = ["--data", str(text_file(tmp_path)), "--set", *sets]
    ddp, fsdp, resumed = tmp_path / "ddp", tmp_path / "fsdp", tmp_path / "resumed"
    launch = [*TORCHRUN, "--standalone", f"--nproc_per_node={n}", "-m", "glassgpt"]
    run([*launch, *glassgpt(*base, "--out", str(ddp))[3:]])  # one after the other: the same GPUs
    run([*launch, *glassgpt(*base, "train.parallel=fsdp", "--out", str(fsdp))[3:]])
    assert_same_losses(ddp, fsdp, range(1, 7), tol=2e-2)
    assert json.loads((fsdp / "run.json").read_text())["backend"] == "nccl"
    run([*launch, "train", "--resume", str(fsdp / "ckpt" / "step_000003"), "--out", str(resumed)])
    assert_same_losses(fsdp, resumed, range(4, 7), tol=1e-3)


@pytest.mark.parametrize(
    ("fields", "dtype", "named"),
    [
        ({"optimizer": "muon"}, None, "train.optimizer"),
        ({}, torch.float16, "train.precision"),
    ],
)
def test_fsdp_refuses_what_it_cannot_shard(
    fields: dict, dtype: torch.dtype | None, named: str
) -> None:
    from glassgpt.errors import ConfigError
    from glassgpt.train.config import TrainConfig
    from glassgpt.train.distributed import DistContext
    from glassgpt.train.parallel import check_parallel

    cfg = TrainConfig(parallel="fsdp", **fields)
    with pytest.raises(ConfigError) as e:
        check_parallel(cfg, DistContext(world_size=2), dtype)
    assert e.value.field == named and "\n" not in str(e.value)
    check_parallel(TrainConfig(parallel="ddp", **fields), DistContext(world_size=2), dtype)


def test_memory_precheck_counts_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU that holds one FSDP rank's share but not DDP's whole model: DDP is refused before
    it starts, FSDP over 8 ranks is let through."""
    from glassgpt.errors import GlassError
    from glassgpt.model.memory import estimate_training_memory, per_rank_memory
    from glassgpt.train import inputs
    from glassgpt.train.config import load_run_config

    cfg = load_run_config(preset="gpt2", overrides=["model.n_vocab=50304"])
    args = (cfg.model, 4, cfg.seq_len, "bfloat16")
    whole = estimate_training_memory(*args, device="cuda").total  # DDP's pre-check
    fsdp = per_rank_memory(*args, world_size=8, parallel="fsdp").total
    assert fsdp < whole
    monkeypatch.setattr(inputs, "available_memory", lambda device: (whole + fsdp) // 2)
    gpu = torch.device("cuda")
    with pytest.raises(GlassError, match="needs about"):
        inputs.check_memory(cfg, 4, torch.bfloat16, gpu, 1, world_size=8)
    fsdp_cfg = cfg.replace(train=dataclasses.replace(cfg.train, parallel="fsdp"))
    inputs.check_memory(fsdp_cfg, 4, torch.bfloat16, gpu, 1, world_size=8)
