/* The scanners of _fastbpe.c (included there, one translation unit): where the chunk that
   starts at byte i ends, for the "gpt2" and "gpt4" patterns of pretokenize.py. t is the
   class table (GROUP, FOLD), s the UTF-8 text of n bytes. */

/* ---- the scanners: end of the chunk that starts at byte i (pretokenize.py's patterns) ---- */

static inline uint32_t cp_at(const uint8_t *s, Py_ssize_t i, int *len) { /* valid UTF-8 */
    uint8_t c = s[i];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xe0) { *len = 2; return (c & 0x1f) << 6 | (s[i + 1] & 0x3f); }
    if (c < 0xf0) { *len = 3; return (c & 0x0f) << 12 | (s[i + 1] & 0x3f) << 6 | (s[i + 2] & 0x3f); }
    *len = 4;
    return (c & 0x07) << 18 | (s[i + 1] & 0x3f) << 12 | (s[i + 2] & 0x3f) << 6 | (s[i + 3] & 0x3f);
}

static Py_ssize_t run_of(const uint8_t *t, const uint8_t *s, Py_ssize_t i, Py_ssize_t n, int g,
                         Py_ssize_t max_chars) { /* end of the run of group g from i */
    int len;
    for (Py_ssize_t k = 0; i < n && k < max_chars && GROUP(t, cp_at(s, i, &len)) == g; k++) i += len;
    return i;
}

/* Whitespace at i. gpt2: \s+(?!\S)|\s+ ; gpt4: \s++$|\s*[\r\n]|\s+(?!\S)|\s */
static Py_ssize_t space_end(const uint8_t *t, const uint8_t *s, Py_ssize_t i, Py_ssize_t n, int gpt4) {
    Py_ssize_t p = i, last = i, after_nl = -1, r = 0;
    int len;
    while (p < n) {
        uint32_t c = cp_at(s, p, &len);
        if (GROUP(t, c) != G_SPACE) break;
        last = p;
        p += len;
        r++;
        if (c == '\r' || c == '\n') after_nl = p;
    }
    if (p == n) return n;
    if (gpt4 && after_nl > 0) return after_nl;
    if (r > 1) return last; /* backtrack one: the rest of the run is followed by space */
    return p;
}

static Py_ssize_t gpt2_end(const uint8_t *t, const uint8_t *s, Py_ssize_t i, Py_ssize_t n) {
    /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    int len, len2;
    uint32_t c = cp_at(s, i, &len);
    if (c == '\'' && i + 1 < n) {
        uint8_t a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
    }
    int g = GROUP(t, c);
    if (g != G_SPACE) return run_of(t, s, i, n, g, PY_SSIZE_T_MAX);
    if (c == ' ' && i + 1 < n) {
        int g2 = GROUP(t, cp_at(s, i + 1, &len2));
        if (g2 != G_SPACE) return run_of(t, s, i + 1, n, g2, PY_SSIZE_T_MAX);
    }
    return space_end(t, s, i, n, 0);
}

static Py_ssize_t newlines_after(const uint8_t *s, Py_ssize_t p, Py_ssize_t n) { /* [\r\n]*+ */
    while (p < n && (s[p] == '\r' || s[p] == '\n')) p++;
    return p;
}

static Py_ssize_t gpt4_end(const uint8_t *t, const uint8_t *s, Py_ssize_t i, Py_ssize_t n) {
    /* '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|
       ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s */
    int len, len2, len3;
    uint32_t c = cp_at(s, i, &len);
    if (c == '\'' && i + 1 < n) {
        int f = FOLD(t, cp_at(s, i + 1, &len2));
        if (f == F_S || f == F_D || f == F_M || f == F_T) return i + 1 + len2;
        if ((f == F_L || f == F_V || f == F_R) && i + 1 + len2 < n) {
            int f2 = FOLD(t, cp_at(s, i + 1 + len2, &len3));
            if ((f == F_L && f2 == F_L) || (f != F_L && f2 == F_E)) return i + 1 + len2 + len3;
        }
    }
    int g = GROUP(t, c);
    if (g == G_LETTER) return run_of(t, s, i, n, G_LETTER, PY_SSIZE_T_MAX);
    int g2 = i + len < n ? GROUP(t, cp_at(s, i + len, &len2)) : -1;
    if (g != G_NUMBER && c != '\r' && c != '\n' && g2 == G_LETTER)
        return run_of(t, s, i + len, n, G_LETTER, PY_SSIZE_T_MAX);
    if (g == G_NUMBER) return run_of(t, s, i, n, G_NUMBER, 3);
    if (g == G_OTHER) return newlines_after(s, run_of(t, s, i, n, G_OTHER, PY_SSIZE_T_MAX), n);
    if (c == ' ' && g2 == G_OTHER)
        return newlines_after(s, run_of(t, s, i + 1, n, G_OTHER, PY_SSIZE_T_MAX), n);
    return space_end(t, s, i, n, 1);
}
