"""Run configuration: ``seed`` + ``model.*`` (GPTConfig) + ``train.*`` + ``data.*``, from TOML.

Resolution order: the preset (``presets/NAME.toml``) or ``--config FILE``, then ``--data``,
then each ``--set dotted.key=value`` override; the result is validated as typed, frozen
dataclasses whose errors name the dotted key. The learning-rate schedule the train fields
describe is

    lr(s) = lr · (s + 1)/(warmup_steps + 1)                                  s < warmup_steps
    lr(s) = min_lr + ½ (lr − min_lr)(1 + cos(π (s − warmup)/(decay − warmup)))  warmup ≤ s < decay
    lr(s) = min_lr                                                            s ≥ decay

(``schedule = "cosine"``; ``"linear"`` decays linearly, ``"constant"`` keeps ``lr`` after warmup).

>>> cfg = load_run_config(preset="cpu-tiny", overrides=["train.lr=3e-3", "seed=7"])
>>> (cfg.seed, cfg.train.lr, cfg.model.n_layers)
(7, 0.003, 2)
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from glassgpt.config import apply_overrides, check, from_dict, load_toml, merge, to_dict
from glassgpt.errors import ConfigError
from glassgpt.model.config import GPTConfig

Precision = Literal["auto", "fp32", "bf16", "fp16"]
Schedule = Literal["cosine", "linear", "constant"]
Optimizer = Literal["adamw", "muon"]
Parallel = Literal["ddp", "fsdp"]

# Keys that may differ between a checkpoint's config and the config of its resumption: they
# change how long or how visibly the run goes on, never what a step computes.
RESUMABLE_KEYS: frozenset[str] = frozenset(
    {
        "train.max_steps",
        "train.eval_every",
        "train.eval_batches",
        "train.checkpoint_every",
        "train.keep_last",
        "train.log_every",
        "train.progress",
        "train.sample_tokens",
        "train.sample_prompt",
        "train.sample_temperature",
        "train.sample_top_k",
        "train.compile",
        "train.tf32",
        "train.threads",
        "train.device",
        "train.parallel",
        "train.inspect_every",
        "log.to",
        "log.project",
        "log.group",
        "log.name",
    }
)

TRACKERS = ("csv", "tensorboard", "wandb", "mlflow")
INSPECT_MAX_HEADS = 64  # train.inspect_every's default is on for models of at most this many heads


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation: AdamW on a warmup + decay schedule, evaluation, checkpoints, logging.

    ``batch_size`` is the GLOBAL number of sequences per optimizer step, whatever the number
    of processes: each of W ranks runs ``grad_accum`` micro-batches of
    ``batch_size / (W · grad_accum)`` sequences, so a config trains the same way on 1 or N.
    """

    max_steps: int = 2000
    batch_size: int = 12
    grad_accum: int = 1
    seq_len: int | None = None  # default: model.n_ctx
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    decay_steps: int | None = None  # default: max_steps
    schedule: Schedule = "cosine"
    optimizer: Optimizer = "adamw"  # muon: Muon for the blocks' matrices (glassgpt.train.muon)
    muon_lr: float | None = None  # Muon's peak learning rate (default: lr), same schedule
    muon_momentum: float = 0.95
    muon_ns_steps: int = 5  # Newton–Schulz steps of Muon's orthogonalisation
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 turns clipping off
    eval_every: int = 250
    eval_batches: int | None = 20  # None: the whole validation split
    checkpoint_every: int = 500  # 0: only at the end (and on SIGINT/SIGTERM)
    keep_last: int = 3
    log_every: int = 1
    precision: Precision = "auto"
    compile: bool | None = None  # None: torch.compile on CUDA devices, eager elsewhere
    tf32: bool = True  # on CUDA, float32 matrix products may use TF32 tensor cores
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    threads: int | None = None  # CPU threads per process; default cores // local processes
    parallel: Parallel = "ddp"  # across processes: ddp replicates, fsdp shards (train.parallel)
    sample_tokens: int = 200  # 0: no samples at eval time
    sample_prompt: str = "\n"
    sample_temperature: float = 0.8
    sample_top_k: int | None = 40
    progress: bool = True
    # head scores, logit-lens losses and attention entropies every N steps (glassgpt.model.probes);
    # None: at every evaluation for models of ≤ INSPECT_MAX_HEADS heads in all, else off; 0: off
    inspect_every: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "grad_accum", "eval_every", "log_every"):
            _positive(f"train.{name}", getattr(self, name))
        for name in (
            "warmup_steps", "checkpoint_every", "keep_last", "sample_tokens", "inspect_every"
        ):  # fmt: skip
            value = getattr(self, name)
            if value is not None:
                check(value >= 0, f"train.{name}", f"must be ≥ 0, got {value}")
        for name in ("seq_len", "decay_steps", "eval_batches", "threads", "sample_top_k"):
            if getattr(self, name) is not None:
                _positive(f"train.{name}", getattr(self, name))
        for name in ("lr", "eps"):
            value = getattr(self, name)
            check(value > 0 and math.isfinite(value), f"train.{name}", f"must be > 0, got {value}")
        if self.muon_lr is not None:
            ok = self.muon_lr > 0 and math.isfinite(self.muon_lr)
            check(ok, "train.muon_lr", f"must be > 0, got {self.muon_lr}")
        check(
            0 <= self.muon_momentum < 1,
            "train.muon_momentum",
            f"must be in [0, 1), got {self.muon_momentum}",
        )
        ns = self.muon_ns_steps
        ok = isinstance(ns, int) and not isinstance(ns, bool) and ns >= 1
        check(ok, "train.muon_ns_steps", f"must be a positive integer, got {ns!r}")
        check(0 <= self.min_lr <= self.lr, "train.min_lr", f"must be in [0, lr], got {self.min_lr}")
        check(self.weight_decay >= 0, "train.weight_decay", f"must be ≥ 0, got {self.weight_decay}")
        check(self.grad_clip >= 0, "train.grad_clip", f"must be ≥ 0, got {self.grad_clip}")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            check(0 <= value < 1, f"train.{name}", f"must be in [0, 1), got {value}")
        check(
            self.sample_temperature > 0,
            "train.sample_temperature",
            f"must be > 0, got {self.sample_temperature}",
        )
        device = self.device
        check(
            device in ("auto", "cpu", "cuda", "mps")
            or (device.startswith("cuda:") and device[5:].isdigit()),
            "train.device",
            f"must be auto, cpu, cuda, cuda:N or mps, got {device!r}",
        )
        check(
            self.batch_size % self.grad_accum == 0,
            "train.grad_accum",
            f"grad_accum={self.grad_accum} must divide batch_size={self.batch_size}",
        )

    @property
    def total_decay_steps(self) -> int:
        return self.decay_steps if self.decay_steps is not None else self.max_steps


@dataclass(frozen=True)
class DataConfig:
    """What to train on: prepared folders or text files (none: the embedded stdlib corpus)."""

    paths: tuple[str, ...] = ()
    tokenizer: str = "char"  # char | bpe | path to a saved tokenizer JSON
    vocab_size: int = 512  # for tokenizer = "bpe"
    val_fraction: float = 0.1
    max_bytes: int | None = None  # cap on the text read (default corpus: its own cap)
    pad_vocab_to: int = 1  # model.n_vocab: the tokenizer's, rounded up to a multiple of this
    text_field: str = "text"  # the text field (column) of .jsonl/.json/.parquet/dataset inputs
    skip_bad: bool = False  # skip (and count) records without a string text field
    # probability that a training window repeats one of its own spans later (glassgpt.data.sampler)
    repeat_spans: float = 0.0

    def __post_init__(self) -> None:
        _positive("data.vocab_size", self.vocab_size)
        check(
            0 <= self.repeat_spans <= 1,
            "data.repeat_spans",
            f"must be in [0, 1], got {self.repeat_spans}",
        )
        _positive("data.pad_vocab_to", self.pad_vocab_to)
        check(
            0 < self.val_fraction < 1,
            "data.val_fraction",
            f"must be in (0, 1), got {self.val_fraction}",
        )
        if self.max_bytes is not None:
            _positive("data.max_bytes", self.max_bytes)
        check(bool(self.tokenizer), "data.tokenizer", "must be char, bpe or a tokenizer file")
        check(bool(self.text_field), "data.text_field", "must name a field")


@dataclass(frozen=True)
class LogConfig:
    """Where the metrics go besides ``metrics.jsonl``: experiment trackers (glassgpt.train.trackers).

    ``to``: any of csv, tensorboard, wandb, mlflow. ``project``: the wandb project and the
    MLflow experiment; ``group``: the wandb group (a sweep sets it; its MLflow experiment
    then); ``name``: the run's name there (default: its folder's name).
    """

    to: tuple[str, ...] = ()
    project: str = "glassgpt"
    group: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        for t in self.to:
            check(t in TRACKERS, "log.to", f"unknown tracker {t!r}; known: {', '.join(TRACKERS)}")
        check(len(set(self.to)) == len(self.to), "log.to", f"names a tracker twice: {self.to}")
        check(bool(self.project), "log.project", "must not be empty")


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs: ``seed``, ``model`` (GPTConfig), ``train``, ``data``, ``log``."""

    seed: int = 1337
    model: GPTConfig = field(default_factory=GPTConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        check(0 <= self.seed < 2**63, "seed", f"must be in [0, 2^63), got {self.seed}")
        check(
            self.seq_len <= self.model.n_ctx,
            "train.seq_len",
            f"seq_len={self.seq_len} exceeds the model's context model.n_ctx={self.model.n_ctx}",
        )

    @property
    def inspect_every(self) -> int:
        """Steps between probes of the circuits (0: none): ``train.inspect_every``, else
        ``train.eval_every`` for models of at most INSPECT_MAX_HEADS heads in all."""
        if self.train.inspect_every is not None:
            return self.train.inspect_every
        small = self.model.n_layers * self.model.n_heads <= INSPECT_MAX_HEADS
        return self.train.eval_every if small else 0

    @property
    def seq_len(self) -> int:
        """Tokens per training sequence: ``train.seq_len``, else the model's context."""
        return self.train.seq_len if self.train.seq_len is not None else self.model.n_ctx

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def replace(self, **sections: Any) -> RunConfig:
        return dataclasses.replace(self, **sections)


def _positive(name: str, value: Any) -> None:
    check(
        isinstance(value, int) and not isinstance(value, bool) and value >= 1,
        name,
        f"must be a positive integer, got {value!r}",
    )


# -- loading -------------------------------------------------------------------------------


def preset_names() -> list[str]:
    """The run presets shipped in ``glassgpt/presets``."""
    root = resources.files("glassgpt") / "presets"
    return sorted(p.name[: -len(".toml")] for p in root.iterdir() if p.name.endswith(".toml"))


def preset_dict(name: str) -> dict[str, Any]:
    """The raw TOML table of a run preset; an unknown name lists the known ones."""
    known = preset_names()
    if name not in known:
        raise ConfigError("preset", f"unknown preset {name!r}; known: {', '.join(known)}")
    path = resources.files("glassgpt") / "presets" / f"{name}.toml"
    with resources.as_file(path) as p:
        return load_toml(p)


def raw_run_config(
    *,
    preset: str | None = None,
    config_file: str | Path | None = None,
    data_paths: Sequence[str] | None = None,
    overrides: Iterable[str] = (),
) -> dict[str, Any]:
    """The raw (unvalidated) run config as a dict: preset or file, ``--data``, ``--set``."""
    if preset is not None and config_file is not None:
        raise ConfigError("preset", "give either --preset or --config, not both")
    raw = load_toml(config_file) if config_file is not None else preset_dict(preset or "default")
    raw.pop("description", None)
    if config_file is not None and not raw:
        raise ConfigError(
            "--config",
            f"{config_file} sets nothing, so the run would be GPT-2-small defaults on the "
            "default corpus; give at least a [model] or [train] table, or use --preset",
        )
    if data_paths:
        raw = merge(raw, {"data": {"paths": [str(p) for p in data_paths]}})
    return apply_overrides(raw, list(overrides))


def padded_vocab(n_vocab: int, multiple: int) -> int:
    """``n_vocab`` rounded up to a multiple of ``multiple`` (ids past the tokenizer's are never
    targets and never sampled; aligned shapes keep GPU matrix products on their fast tiles).

    >>> padded_vocab(50257, 64), padded_vocab(65, 1)
    (50304, 65)
    """
    return -(-n_vocab // multiple) * multiple


def build_run_config(raw: Mapping[str, Any], *, n_vocab: int | None = None) -> RunConfig:
    """Validate a raw config; ``n_vocab`` (the tokenizer's) fills ``model.n_vocab`` if unset,
    rounded up to a multiple of ``data.pad_vocab_to``.

    A ``model.n_vocab`` given explicitly may pad the vocabulary but never cut it.
    """
    data = dict(raw)
    for section in ("model", "train", "data", "log"):
        value = data.get(section, {})
        check(
            isinstance(value, Mapping),
            section,
            f"expected a table of fields ([{section}] in TOML, {section}.KEY=VALUE with --set), "
            f"got {value!r}",
        )
    model = dict(data.get("model", {}))
    if n_vocab is not None:
        if "n_vocab" in model:
            given = model["n_vocab"]
            check(
                isinstance(given, int) and given >= n_vocab,
                "model.n_vocab",
                f"{given!r} is smaller than the tokenizer's vocabulary of {n_vocab}",
            )
        else:
            multiple = dict(data.get("data", {})).get("pad_vocab_to", 1)
            ok = isinstance(multiple, int) and not isinstance(multiple, bool) and multiple >= 1
            model["n_vocab"] = padded_vocab(n_vocab, multiple) if ok else n_vocab  # else: the
            # DataConfig check names data.pad_vocab_to
    data["model"] = model
    return from_dict(RunConfig, data)


def load_run_config(
    *,
    preset: str | None = None,
    config_file: str | Path | None = None,
    data_paths: Sequence[str] | None = None,
    overrides: Iterable[str] = (),
) -> RunConfig:
    """Resolve and validate a run config (``model.n_vocab`` as given or its default)."""
    raw = raw_run_config(
        preset=preset, config_file=config_file, data_paths=data_paths, overrides=overrides
    )
    return build_run_config(raw)


# Fields that apply only to some variants: (section, field) → does it apply to this config?
_APPLIES: dict[tuple[str, str], Any] = {
    ("data", "vocab_size"): lambda c: c["data"]["tokenizer"] == "bpe",
    ("model", "rope_base"): lambda c: c["model"]["positional"] == "rope",
    ("model", "mlp_gate"): lambda c: c["model"]["mlp"] == "gated",
    ("model", "mlp_value"): lambda c: c["model"]["mlp"] == "gated",
    ("model", "unembed_bias"): lambda c: c["model"]["bias"],
}


def applicable(config: Mapping[str, Any]) -> dict[str, Any]:
    """A resolved config (``RunConfig.to_dict()``) without the fields its variants ignore: no
    ``vocab_size`` for a character tokenizer, no ``rope_base`` with learned positions.

    >>> shown = applicable(load_run_config(preset="cpu-tiny").to_dict())
    >>> "vocab_size" in shown["data"], "rope_base" in shown["model"]
    (False, False)
    """
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in config.items()}
    for (section, name), applies in _APPLIES.items():
        if name in out.get(section, {}) and not applies(config):
            del out[section][name]
    return out


def config_diff(old: RunConfig, new: RunConfig) -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose values differ between two configs (fields that apply to them):
    ``{key: (old, new)}``."""
    a, b = _flatten(applicable(old.to_dict())), _flatten(applicable(new.to_dict()))
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


# -- writing TOML (the standard library reads TOML but does not write it) ------------------


def dump_toml(data: Mapping[str, Any]) -> str:
    """TOML text for a dict of scalars, lists and one level of tables; ``None`` is left out.

    >>> print(dump_toml({"seed": 1, "train": {"lr": 0.001, "tag": "a\\"b"}, "v": [1, 2]}))
    seed = 1
    v = [1, 2]
    <BLANKLINE>
    [train]
    lr = 0.001
    tag = "a\\"b"
    <BLANKLINE>
    """
    lines = [
        f"{k} = {_toml_value(v)}"
        for k, v in data.items()
        if v is not None and not isinstance(v, Mapping)
    ]
    for name, table in data.items():
        if isinstance(table, Mapping):
            lines += ["", f"[{name}]"]
            for k, v in table.items():
                if isinstance(v, Mapping):
                    raise ConfigError(f"{name}.{k}", "nested tables are not supported here")
                if v is not None:
                    lines.append(f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        if isinstance(v, float) and not math.isfinite(v):
            return {math.inf: "inf", -math.inf: "-inf"}.get(v, "nan")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")
