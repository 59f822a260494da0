from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import pytest

from glassgpt.data.corpus import (
    default_corpus_files,
    iter_default_corpus,
    scan_default_corpus,
    stdlib_dir,
)
from glassgpt.errors import GlassError


def _make_root(tmp_path: Path) -> Path:
    root = tmp_path / "lib"
    files = {
        "os.py": b"import sys\n",
        "json/__init__.py": b"'''json'''\n" * 10,
        "json/empty.py": b"",
        "enc/latin1.py": "# coding: latin-1\nx = 'caf\xe9'\n".encode("latin-1"),
        "site-packages/thirdparty.py": b"x = 1\n",
        "dist-packages/other.py": b"x = 2\n",
        ".hidden/h.py": b"x = 3\n",
        "notes.txt": b"not python\n",
        "a/b/deep.py": "π = 3.14159\n".encode(),
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_policy_on_a_known_tree(tmp_path: Path) -> None:
    root = _make_root(tmp_path)
    scan = scan_default_corpus(root=root)
    rels = [p.relative_to(root).as_posix() for p in scan.files]
    expected = ["os.py", "json/__init__.py", "a/b/deep.py"]  # the latin-1 file is skipped
    assert rels == sorted(expected, key=lambda r: hashlib.sha256(r.encode()).hexdigest())
    assert [p.relative_to(root).as_posix() for p, _ in scan.skipped] == ["enc/latin1.py"]
    assert "byte" in scan.skipped[0][1]
    assert list(scan.sizes) == [p.stat().st_size for p in scan.files]


def test_size_cap_skips_files_that_overflow(tmp_path: Path) -> None:
    root = _make_root(tmp_path)
    full = scan_default_corpus(root=root)
    cap = max(full.sizes) - 1  # the largest file can never fit
    capped = scan_default_corpus(cap, root=root)
    # oracle: greedy over the full order
    total, expected = 0, []
    for p, n in zip(full.files, full.sizes):
        if total + n <= cap:
            expected.append(p)
            total += n
    assert list(capped.files) == expected and capped.n_bytes <= cap
    with pytest.raises(GlassError, match="no usable"):
        scan_default_corpus(1, root=root)
    with pytest.raises(GlassError, match="positive"):
        scan_default_corpus(0, root=root)


def test_default_corpus_is_the_stdlib_and_deterministic() -> None:
    root = stdlib_dir()
    assert root == Path(sysconfig.get_paths()["stdlib"])
    files = default_corpus_files(1_000_000)
    assert files == default_corpus_files(1_000_000)
    assert len(files) > 20
    assert all(p.suffix == ".py" and root in p.parents for p in files)
    assert not any({"site-packages", "dist-packages"} & set(p.parts) for p in files)
    texts = list(iter_default_corpus(1_000_000))
    assert [t.encode("utf-8") for t in texts] == [p.read_bytes() for p in files]
    assert 0 < sum(len(t.encode()) for t in texts) <= 1_000_000
    assert any("def " in t for t in texts)


def test_full_default_corpus_covers_the_library() -> None:
    scan = scan_default_corpus()
    rels = {p.relative_to(scan.root).as_posix() for p in scan.files}
    assert {"os.py", "json/__init__.py", "collections/__init__.py"} <= rels
    assert scan.n_bytes > 5_000_000
    for path, why in scan.skipped:  # skipped files really are not UTF-8
        with pytest.raises(UnicodeDecodeError):
            path.read_bytes().decode("utf-8")
        assert "UTF-8" in why
