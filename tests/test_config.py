from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from glassgpt.config import apply_overrides, from_dict, load_toml, to_dict
from glassgpt.errors import ConfigError, GlassError


@dataclass(frozen=True)
class Inner:
    lr: float = 1e-3
    kind: Literal["a", "b"] = "a"
    layers: tuple[int, ...] = (1, 2)


@dataclass(frozen=True)
class Outer:
    seed: int = 0
    name: str | None = None
    inner: Inner = Inner()


def test_nested_from_dict_and_round_trip() -> None:
    cfg = from_dict(Outer, {"seed": 3, "inner": {"lr": "2e-4", "kind": "b", "layers": [4]}})
    assert cfg == Outer(seed=3, inner=Inner(lr=2e-4, kind="b", layers=(4,)))
    assert from_dict(Outer, to_dict(cfg)) == cfg


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"inner": {"kind": "c"}}, "inner.kind"),
        ({"inner": {"nope": 1}}, "inner.nope"),
        ({"seed": "x"}, "seed"),
        ({"seed": True}, "seed"),
        ({"inner": {"lr": "fast"}}, "inner.lr"),
    ],
)
def test_errors_name_the_field(data: dict, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        from_dict(Outer, data)
    assert e.value.field == field
    assert str(e.value).startswith(field + ":")


def test_overrides_parse_toml_values() -> None:
    out = apply_overrides({"a": {"b": 1}}, ["a.b=2.5", "a.c=true", "d=hello", "name=none"])
    assert out == {"a": {"b": 2.5, "c": True}, "d": "hello", "name": "none"}
    assert from_dict(Outer, {"name": out["name"]}).name is None
    with pytest.raises(ConfigError):
        apply_overrides({}, ["novalue"])
    with pytest.raises(ConfigError):
        apply_overrides({"a": 1}, ["a.b=2"])


def test_load_toml_errors(tmp_path) -> None:
    with pytest.raises(GlassError, match="not found"):
        load_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("a = [", encoding="utf-8")
    with pytest.raises(GlassError, match="invalid TOML"):
        load_toml(bad)
    good = tmp_path / "good.toml"
    good.write_text("[inner]\nlr = 0.5\n", encoding="utf-8")
    assert from_dict(Outer, load_toml(good)).inner.lr == 0.5
