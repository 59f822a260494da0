"""Sweep grids: the Cartesian product of config overrides × seeds, read from TOML.

A grid file::

    preset = "cpu-tiny"            # training preset for every run (optional)
    config = "base.toml"           # or a training config file (optional, relative to the grid)
    data = ["corpus.txt"]          # data paths (optional; default: the embedded corpus)
    seeds = [0, 1, 2]              # each point is trained once per seed
    parallel = 2                   # runs at once (each gets cores / parallel threads)

    [executor]                     # where runs train (optional; see scaling/executors.py)
    kind = "slurm"                 # local (default) | slurm | ray
    partition = "gpu"
    gpus = 1

    [set]                          # fixed overrides for every run
    "train.eval_every" = 100

    [grid]                         # axes; a value is a list of scalars or of tables
    "train.max_steps" = [200, 400]
    size = [                       # a table sets several keys together
      { "model.d_model" = 64, "model.n_heads" = 2 },
      { "model.d_model" = 128, "model.n_heads" = 4 },
    ]

gives 2 × 2 × 3 = 12 runs. Each run is a dict of dotted overrides with a stable name. An
optional ``description`` says what the grid studies. Built-in grids (the studies shipped in
``glassgpt/scaling/studies``) load by name where no file of that name exists.

>>> g = Grid.from_dict({"seeds": [0, 1], "grid": {"train.lr": [0.1, 0.2]}})
>>> [r.name for r in g.runs()]
['train.lr=0.1,seed=0', 'train.lr=0.1,seed=1', 'train.lr=0.2,seed=0', 'train.lr=0.2,seed=1']
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from glassgpt.config import load_toml
from glassgpt.errors import ConfigError, InputFileError

GRID_KEYS = (
    "description", "preset", "config", "data", "seeds", "parallel", "set", "grid", "executor",
)  # fmt: skip
STUDIES = "scaling/studies"  # the built-in grids, inside the glassgpt package


def study_names() -> list[str]:
    """The built-in grids (studies) shipped with glassgpt.

    >>> {"vocab", "tying", "d-head", "scaling-cpu"} <= set(study_names())
    True
    """
    root = resources.files("glassgpt").joinpath(STUDIES)
    return sorted(p.name[: -len(".toml")] for p in root.iterdir() if p.name.endswith(".toml"))


def study_description(name: str) -> str:
    """The ``description`` line of a built-in grid."""
    return str(load_study_dict(name).get("description", ""))


def load_study_dict(name: str) -> dict[str, Any]:
    """The raw TOML table of a built-in grid; an unknown name lists the known ones."""
    known = study_names()
    if name not in known:
        raise InputFileError(
            f"no grid file or built-in study named {name!r}; built-in studies: {', '.join(known)}"
        )
    with resources.as_file(resources.files("glassgpt").joinpath(STUDIES, f"{name}.toml")) as p:
        return load_toml(p)


@dataclass(frozen=True)
class RunSpec:
    """One training run of a sweep: its overrides (dotted keys) and a stable, readable name."""

    overrides: dict[str, Any]
    name: str

    @property
    def set_args(self) -> list[str]:
        """The overrides as ``key=value`` strings for ``glassgpt train --set``."""
        return [f"{k}={_toml_value(v)}" for k, v in self.overrides.items()]


@dataclass(frozen=True)
class Grid:
    preset: str | None = None
    description: str = ""
    config: str | None = None
    data: tuple[str, ...] = ()
    seeds: tuple[int, ...] = (0,)
    parallel: int = 1
    fixed: dict[str, Any] = field(default_factory=dict)
    axes: dict[str, list[Any]] = field(default_factory=dict)
    executor: dict[str, Any] = field(default_factory=dict)  # the raw [executor] table

    @classmethod
    def resolve(cls, name_or_path: str | Path) -> Grid:
        """The grid in a TOML file, or else the built-in study of that name (``vocab``...)."""
        path = Path(name_or_path)
        if path.is_file() or path.suffix == ".toml" or len(path.parts) > 1:
            return cls.load(path)
        return cls.from_dict(load_study_dict(str(name_or_path)))

    @classmethod
    def load(cls, path: str | Path) -> Grid:
        path = Path(path)
        if not path.is_file():
            raise InputFileError(f"grid file not found: {path}")
        grid = cls.from_dict(load_toml(path))
        if grid.config is not None and not Path(grid.config).is_absolute():
            grid = _replace(grid, config=str((path.parent / grid.config).resolve()))
        if grid.data:
            data = tuple(
                d if Path(d).is_absolute() else str((path.parent / d).resolve()) for d in grid.data
            )
            grid = _replace(grid, data=data)
        return grid

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Grid:
        unknown = sorted(set(data) - set(GRID_KEYS))
        if unknown:
            raise ConfigError(unknown[0], f"unknown grid key; known: {', '.join(GRID_KEYS)}")
        seeds = data.get("seeds", [0])
        if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
            raise ConfigError("seeds", f"must be a non-empty list of integers, got {seeds!r}")
        parallel = data.get("parallel", 1)
        if not isinstance(parallel, int) or parallel < 1:
            raise ConfigError("parallel", f"must be a positive integer, got {parallel!r}")
        fixed = dict(_flatten(data.get("set", {}), "set"))
        axes: dict[str, list[Any]] = {}
        for name, values in dict(data.get("grid", {})).items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"grid.{name}", "an axis must be a non-empty list")
            axes[name] = values
        executor = data.get("executor", {})
        if not isinstance(executor, Mapping):
            raise ConfigError("executor", f"must be a table, got {executor!r}")
        raw_data = data.get("data", [])
        return cls(
            preset=data.get("preset"),
            description=str(data.get("description", "")),
            config=data.get("config"),
            data=tuple([raw_data] if isinstance(raw_data, str) else raw_data),
            seeds=tuple(seeds),
            parallel=parallel,
            fixed=fixed,
            axes=axes,
            executor=dict(executor),
        )

    def with_data(self, paths: list[str]) -> Grid:
        """The same grid on other data (paths made absolute: runs start in their own folders)."""
        return _replace(self, data=tuple(str(Path(p).resolve()) for p in paths))

    def runs(self) -> Iterator[RunSpec]:
        """Every point of the grid × every seed, in a deterministic order."""
        choices = [[(axis, v) for v in values] for axis, values in self.axes.items()]
        for point in itertools.product(*choices):
            overrides = dict(self.fixed)
            label = []
            for axis, value in point:
                if isinstance(value, Mapping):
                    items = dict(_flatten(value, f"grid.{axis}"))
                    overrides.update(items)
                    label.append(",".join(f"{k}={_short(v)}" for k, v in items.items()))
                else:
                    overrides[axis] = value
                    label.append(f"{axis}={_short(value)}")
            for seed in self.seeds:
                name = ",".join([*label, f"seed={seed}"])
                yield RunSpec({**overrides, "seed": seed}, _safe_name(name))


def _flatten(table: Any, where: str, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if not isinstance(table, Mapping):
        raise ConfigError(where, "expected a table of key = value overrides")
    for k, v in table.items():
        if isinstance(v, Mapping):
            yield from _flatten(v, where, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _short(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _safe_name(name: str) -> str:
    """A directory name: the readable label, or a hash when it is too long for a path."""
    safe = "".join(c if c.isalnum() or c in "=,.-_" else "_" for c in name)
    if len(safe) <= 120:
        return safe
    return safe[:100] + "-" + hashlib.sha256(name.encode()).hexdigest()[:12]


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return repr(v)


def _replace(grid: Grid, **changes: Any) -> Grid:
    return dataclasses.replace(grid, **changes)
