from __future__ import annotations

from pathlib import Path

import pytest

from glassgpt.cli import main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["data", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("glassgpt: error: "), err
    for needle in needles:
        assert needle in lines[0]


def test_missing_input(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope.txt"
    code, _, err = _run(
        capsys, "prepare", "--input", str(missing), "--char", "--output", str(tmp_path / "o")
    )
    _one_line_error(code, err, str(missing), "not found")


def test_empty_input(tmp_path: Path, capsys) -> None:
    (tmp_path / "empty.txt").write_bytes(b"")
    code, _, err = _run(
        capsys,
        "prepare",
        "--input",
        str(tmp_path / "empty.txt"),
        "--char",
        "--output",
        str(tmp_path / "o"),
    )
    _one_line_error(code, err, "empty.txt", "empty")
    (tmp_path / "dir").mkdir()
    code, _, err = _run(
        capsys,
        "prepare",
        "--input",
        str(tmp_path / "dir"),
        "--char",
        "--output",
        str(tmp_path / "o"),
    )
    _one_line_error(code, err, "dir", "no input files")


def test_non_utf8_input_names_file_and_offset(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes("naïve\n".encode() * 1000 + "café".encode("latin-1"))
    code, _, err = _run(
        capsys, "prepare", "--input", str(bad), "--char", "--output", str(tmp_path / "o")
    )
    _one_line_error(code, err, str(bad), f"byte {len('naïve'.encode()) * 1000 + 1000 + 3}")


def test_not_a_data_folder(tmp_path: Path, capsys) -> None:
    code, _, err = _run(capsys, "info", str(tmp_path))
    _one_line_error(code, err, str(tmp_path), "meta.json")


@pytest.mark.parametrize(
    "argv", [["prepare", "--input", "x", "--output", "o"], ["prepare", "--char"]]
)
def test_usage_errors_exit_nonzero(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["data", *argv])
    assert e.value.code == 2
