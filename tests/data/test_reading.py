from __future__ import annotations

from pathlib import Path

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgpt.data.reading import char_boundary, iter_pieces, resolve_inputs, safe_cut
from glassgpt.errors import GlassError, InputFileError
from glassgpt.tokenizer.pretokenize import GPT2_PATTERN, GPT4_PATTERN

# Text with lines, indentation, CRLF, multi-byte characters and long unbroken runs.
texty = st.lists(
    st.one_of(
        st.sampled_from(["\n", "\r\n", "  ", "\t", "x", "def f():", "é", "€", "🙂", "日本"]),
        st.text(max_size=12),
    ),
    max_size=60,
).map("".join)


@given(text=texty, piece_bytes=st.integers(4, 40))
def test_pieces_reassemble_the_file(tmp_path_factory, text: str, piece_bytes: int) -> None:
    path = tmp_path_factory.mktemp("p") / "doc.txt"
    data = text.encode("utf-8")
    path.write_bytes(data)
    pieces = list(iter_pieces(path, piece_bytes))
    assert "".join(p.text for p in pieces) == text
    assert [p.last for p in pieces] == [False] * (len(pieces) - 1) + [True] * bool(pieces)
    offset = 0
    for p in pieces:
        assert p.offset == offset and p.n_bytes == len(p.text.encode("utf-8"))
        assert p.n_bytes <= piece_bytes
        offset += p.n_bytes
    assert offset == len(data)


def test_pieces_cut_at_safe_newlines(tmp_path: Path) -> None:
    lines = [f"line{i} = {i}" if i % 3 else f"    indented{i}" for i in range(200)]
    text = "\n".join(lines) + "\n"
    path = tmp_path / "a.py"
    path.write_text(text)
    pieces = list(iter_pieces(path, 256))
    assert len(pieces) > 5
    for p in pieces[:-1]:
        # every cut is after a newline that sits between two printable non-space characters
        assert p.text.endswith("\n") and not p.text[-2].isspace()
        nxt = text[len(p.text.encode()) + p.offset :]
        assert not nxt[0].isspace()


def test_char_boundary_never_splits_a_character() -> None:
    data = "aé€🙂b".encode()
    boundaries = {len("aé€🙂b"[:k].encode()) for k in range(6)}
    for i in range(len(data) + 1):
        j = char_boundary(data, i)
        assert j in boundaries and j <= i
        assert not any(j < b <= i for b in boundaries)  # the largest one


def test_safe_cut_preferences() -> None:
    assert safe_cut(b"a\nb\n  c\n", 0, 8) == 2  # only a\nb is a safe newline
    assert safe_cut(b"ab  \n  cd", 0, 9) == 2  # no safe newline: before the space after b
    assert safe_cut(b"  \n  \n  ", 0, 8) == 6  # no safe point: after the last newline
    assert safe_cut(b"abc\n def", 4, 8) == 8  # the newline before lo is not seen
    assert safe_cut(b"abcdefgh", 0, 5) == 5


# Whitespace the patterns treat specially, ASCII and not, next to ASCII words and symbols.
spacey = st.lists(
    st.sampled_from(
        [
            " ",
            "  ",
            "\n",
            "\r\n",
            "\t",
            "\x0b",
            "\x0c",
            "\x1c",
            "\x85",
            "\u00a0",
            "\u3000",
            "ab",
            "x",
            "'s",
            "'ll",
            "12345",
            "=",
            "):",
            "é",
            "日本",
            "🙂",
        ]
    ),
    max_size=40,
).map("".join)


@settings(max_examples=300)
@given(text=spacey, lo=st.integers(0, 60), width=st.integers(0, 60))
def test_safe_points_do_not_change_the_chunks(text: str, lo: int, width: int) -> None:
    """At a safe point, both pre-tokenizer patterns split the halves as they split the whole."""
    data = text.encode("utf-8")
    cut = safe_cut(data, lo, lo + width)
    assert 0 <= cut <= len(data) and char_boundary(data, cut) == cut
    printable = set(range(0x21, 0x7F))
    after_newline = 0 < cut < len(data) and data[cut - 1] == 10 and cut >= 2
    safe = (after_newline and data[cut - 2] in printable and data[cut] in printable) or (
        0 < cut < len(data) and data[cut] == 32 and data[cut - 1] in printable
    )
    if not safe:
        return
    a, b = data[:cut].decode(), data[cut:].decode()
    for pattern in (GPT2_PATTERN, GPT4_PATTERN):
        p = regex.compile(pattern)
        assert p.findall(a) + p.findall(b) == p.findall(text)


def test_non_utf8_error_names_the_file_and_absolute_offset(tmp_path: Path) -> None:
    data = ("ok line\n" * 300).encode() + b"caf\xe9\n" + b"more\n" * 10
    path = tmp_path / "latin1.txt"
    path.write_bytes(data)
    with pytest.raises(UnicodeDecodeError) as oracle:
        data.decode("utf-8")
    with pytest.raises(InputFileError) as e:
        list(iter_pieces(path, 64))
    assert str(path) in str(e.value) and f"byte {oracle.value.start}" in str(e.value)


def test_resolve_inputs(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / ".hidden").mkdir()
    for name in ["d/b.txt", "d/a.txt", "d/sub/c.txt", "d/.hidden/x.txt", "d/.dot.txt", "d/z.md"]:
        (tmp_path / name).write_text(name)
    one = tmp_path / "one.txt"
    one.write_text("1")
    got = resolve_inputs([one, tmp_path / "d"])
    assert [p.relative_to(tmp_path).as_posix() for p in got] == [
        "one.txt",
        "d/a.txt",
        "d/b.txt",
        "d/sub/c.txt",
        "d/z.md",
    ]
    assert [p.name for p in resolve_inputs([tmp_path / "d"], "*.txt")] == [
        "a.txt",
        "b.txt",
        "c.txt",
    ]
    with pytest.raises(GlassError, match="not found"):
        resolve_inputs([tmp_path / "missing.txt"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(GlassError, match="no input files"):
        resolve_inputs([tmp_path / "empty"])
    with pytest.raises(GlassError, match="no input"):
        resolve_inputs([])
