"""Any value in any config key either validates or raises the ConfigError that names it."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given
from hypothesis import strategies as st

from glassgpt.config import merge
from glassgpt.errors import ConfigError
from glassgpt.train.config import RunConfig, build_run_config, raw_run_config


def dotted_keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        if dataclasses.is_dataclass(default):
            out += [prefix + f.name, *dotted_keys(type(default), f"{prefix}{f.name}.")]
        else:
            out.append(prefix + f.name)
    return out


KEYS = [*dotted_keys(RunConfig), "model.nope", "extra", "train.lr.deep"]
SECTIONS = {f.name for f in dataclasses.fields(RunConfig)}  # model, train, data, log, seed, ...
scalars = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=8),
    st.sampled_from(["auto", "cuda", "cpu", "bf16", "none", "rope", "gated", "1e-3", "64"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=2)
    ),
    max_leaves=4,
)


def nest(key: str, value: object) -> dict:
    *parents, leaf = key.split(".")
    out: dict = {leaf: value}
    for p in reversed(parents):
        out = {p: out}
    return out


@given(st.sampled_from(KEYS), values)
def test_a_value_validates_or_names_its_key(key: str, value: object) -> None:
    raw = merge(raw_run_config(preset="cpu-tiny"), nest(key, value))
    try:
        cfg = build_run_config(raw, n_vocab=97)
    except ConfigError as e:
        assert str(e).strip() and "\n" not in str(e)
        named = str(e).split(":")[0]
        assert named in KEYS or named.split(".")[0] in SECTIONS, e
        return
    assert isinstance(cfg, RunConfig)
    assert math.isfinite(cfg.train.lr) and cfg.model.n_vocab >= 97
