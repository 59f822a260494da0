"""The import graph of ``src/glassgpt``: no circles, no arrow from a stage up to a stage above it.

Read from the source (``ast``), imports inside functions included (a lazy import is still a
dependency) and those under ``if TYPE_CHECKING:`` left out. The order is README's table:
below every stage the foundation modules, then the kernels, then
tokenizer → model → interop → checkpoint → data → train → sample → inspect → features → scaling →
serve, then the commands (``glassgpt.cli``), and the package root on top. A module may import its own stage and the ones before it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
FOUNDATION = ("errors", "version", "config", "storage", "formats", "console", "devices")
ORDER = (
    "<foundation>", "kernels", "tokenizer", "model", "interop", "checkpoint", "data", "train",
    "sample", "inspect", "features", "scaling", "serve", "cli", "<top>",
)  # fmt: skip
TOP = ("glassgpt", "glassgpt.__main__")


def module_names() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "glassgpt").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(path: Path, module: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` (at ``path``) imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    guarded = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for n in ast.walk(stmt)
    }
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names += [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
    out = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    files = module_names()
    return {m: imported(p, m, set(files)) for m, p in files.items()}


def stage(module: str) -> str:
    if module in TOP:
        return "<top>"
    part = module.split(".")[1]
    return "<foundation>" if part in FOUNDATION else part


def test_every_module_has_a_stage() -> None:
    unplaced = sorted(m for m in graph() if stage(m) not in ORDER)
    assert not unplaced, f"modules outside README's stage order: {unplaced}"


def test_no_stage_imports_a_stage_above_it() -> None:
    upward = sorted(
        f"{m} -> {d}"
        for m, deps in graph().items()
        for d in deps
        if ORDER.index(stage(d)) > ORDER.index(stage(m))
    )
    assert not upward, "imports from a stage up to one above it:\n" + "\n".join(upward)


def test_no_two_modules_import_each_other() -> None:
    g = graph()
    reach: dict[str, set[str]] = {}

    def reachable(m: str) -> set[str]:  # every module m imports, directly or through others
        if m not in reach:
            reach[m] = set()
            todo, seen = list(g[m]), set()
            while todo:
                d = todo.pop()
                if d not in seen:
                    seen.add(d)
                    todo += g[d]
            reach[m] = seen
        return reach[m]

    circles = sorted({" <-> ".join(sorted((m, d))) for m in g for d in g[m] if m in reachable(d)})
    assert not circles, "modules on an import circle:\n" + "\n".join(circles)


def test_outside_code_enters_the_kernels_by_their_door() -> None:
    """Outside ``glassgpt.kernels`` only the package itself is imported (its names are the
    declared operations, ``glassgpt.kernels.door``), never a module inside it."""
    behind = sorted(
        f"{m} -> {d}"
        for m, deps in graph().items()
        for d in deps
        if stage(m) != "kernels" and d.startswith("glassgpt.kernels.")
    )
    assert not behind, "kernel modules imported past the door:\n" + "\n".join(behind)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from glassgpt.train import optim\n", {"glassgpt.train.optim"}),
        ("from . import adamw\n", {"glassgpt.train.adamw"}),
        ("def f():\n    import glassgpt.sample.cache\n", {"glassgpt.sample.cache"}),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import glassgpt.serve\n", set()),
    ],
)
def test_the_reader_follows_every_kind_of_import(tmp_path: Path, source: str, expected) -> None:
    path = tmp_path / "muon.py"
    path.write_text(source)
    known = set(module_names())
    assert imported(path, "glassgpt.train.muon", known) == expected


# Imports inside functions: only of the optional extras (imported on use, each with a one-line
# error naming its extra) and of these few, each for the reason given.
EXTRAS = (
    "tensorboard", "torch.utils.tensorboard", "wandb", "mlflow", "ray", "submitit", "lm_eval",
    "pyarrow", "datasets", "transformers", "tokenizers", "sae_lens", "transformer_lens",
    "playwright",
)  # fmt: skip
DEFERRED = {
    # Python runs the package root before any submodule: a top-level import of the checkpoint
    # stage there would load torch for `glassgpt --help` and `import glassgpt.tokenizer`.
    ("glassgpt", "glassgpt.checkpoint"),
    # the error path of a mistyped flag only: --help stays free of the config's stages
    ("glassgpt.cli", "glassgpt.train.config"),
}


def function_imports(path: Path) -> list[str]:
    """The modules imported inside the functions of the file at ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    out += [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    out.append("." * node.level + (node.module or ""))
    return out


def test_imports_are_plain_and_at_the_top() -> None:
    inside = sorted(
        f"{m} imports {name} inside a function"
        for m, path in module_names().items()
        for name in function_imports(path)
        if not any(name == e or name.startswith(e + ".") for e in EXTRAS)
        and (m, name) not in DEFERRED
    )
    assert not inside, "imports deferred into functions:\n" + "\n".join(inside)


def test_no_package_resolves_its_names_lazily() -> None:
    lazy = sorted(
        m
        for m, path in module_names().items()
        if any(
            isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
            for node in ast.parse(path.read_text(encoding="utf-8")).body
        )
    )
    assert not lazy, f"modules with a module-level __getattr__: {lazy}"
