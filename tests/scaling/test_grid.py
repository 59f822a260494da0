from __future__ import annotations

import pytest

from glassgpt.config import parse_value
from glassgpt.errors import ConfigError
from glassgpt.scaling.grid import Grid


def test_product_of_axes_and_seeds_with_grouped_keys(tmp_path) -> None:
    path = tmp_path / "grid.toml"
    path.write_text(
        """
preset = "cpu-tiny"
data = ["corpus.txt"]
seeds = [0, 1, 2]
[set]
"train.eval_every" = 50
[grid]
"train.max_steps" = [100, 200]
size = [{ "model.d_model" = 64, "model.n_heads" = 2 }, { "model.d_model" = 128, "model.n_heads" = 4 }]
""",
        encoding="utf-8",
    )
    grid = Grid.load(path)
    runs = list(grid.runs())
    assert len(runs) == 2 * 2 * 3
    assert len({r.name for r in runs}) == len(runs)
    assert grid.data == (str(tmp_path / "corpus.txt"),)
    first = runs[0].overrides
    assert first == {
        "train.eval_every": 50,
        "train.max_steps": 100,
        "model.d_model": 64,
        "model.n_heads": 2,
        "seed": 0,
    }
    # --set strings parse back to the same values.
    for run in runs:
        parsed = {k: parse_value(v) for k, _, v in (s.partition("=") for s in run.set_args)}
        assert parsed == run.overrides


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"gird": {}}, "gird"),
        ({"seeds": []}, "seeds"),
        ({"parallel": 0}, "parallel"),
        ({"grid": {"train.lr": []}}, "grid.train.lr"),
        ({"set": 3}, "set"),
    ],
)
def test_bad_grids_name_the_field(data: dict, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        list(Grid.from_dict(data).runs())
    assert e.value.field == field
