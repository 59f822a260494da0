"""Hypothesis strategies shared by the tokenizer tests."""

from __future__ import annotations

from hypothesis import strategies as st

# Text that stresses the pre-tokenizer: whitespace of every kind (Unicode White_Space, and
# U+001C..U+001F which Python's str.isspace counts but \s does not), contractions in both
# cases, digits of several scripts, letters with accents, CJK, emoji, special-token strings.
FRAGMENTS = [
    " ", "  ", "   ", "\n", "\n\n", "\t", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1f",
    "\x85", "\xa0", "\u2009", "\u2028", "\u3000", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
    "'S", "'LL", "'Re", "n't", "'", "ſ", "\u212a", "<|endoftext|>", "<|endoftext", "|>",
    "123", "4567", "١٢٣", "１２", "½", "é", "naïve", "Ωmega", "日本語", "🙂", "👩‍👩‍👧", "e\u0301",
    "...", "!?", "--", "$", "#!", "(", ")", "_", "\\", "\x00", "\x7f",
]  # fmt: skip
ASCII_WORD = st.text(
    st.sampled_from("abcxyzABCXYZ0123456789.,;:!?'\"()-_ \n\t"), min_size=1, max_size=8
)
ANY_CHARS = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=4)
texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), ASCII_WORD, ANY_CHARS), max_size=24).map(
    "".join
)
