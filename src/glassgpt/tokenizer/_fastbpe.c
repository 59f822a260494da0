/* The compiled encoder: the map of tokenizer/bpe.py, in C, for the "gpt2" and "gpt4" patterns.
 *
 *     encode(text) = bpe(utf8(c1)) ++ bpe(utf8(c2)) ++ ...     for c1 c2 ... = split(text)
 *
 * split: a hand-written scanner for each named pattern (tokenizer/pretokenize.py states
 *        them), reading the Unicode classes \p{L}, \p{N}, \s (and, for gpt4, which letters
 *        match (?i:s), (?i:d), ...) from a table that Python builds with the `regex` module
 *        itself, so the classes are the reference's by construction.
 * bpe:   tokenizer/merge.py's loop: repeat { merge the leftmost adjacent pair of lowest
 *        rank } until no pair has a rank. Before that, a piece whose bytes are a token is
 *        that token (valid only when every token's own bytes merge to it, which the
 *        constructor checks with the same loop); pieces longer than LONG_PIECE bytes go to
 *        a Python callable (merge.py's O(n log n) bpe_heap) so none is quadratic.
 * cache: per call, piece bytes -> where its ids were first written, so a repeated word
 *        costs one hash lookup; nothing survives the call (every call is cold).
 * The GIL is released while a text is encoded, so threads encode on every core.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define N_CODEPOINTS 0x110000
#define LONG_PIECE 256
#define NO_MERGE UINT64_MAX
/* class table byte: bits 0-1 group, bits 2-5 case-folded contraction letter (gpt4) */
enum { G_OTHER = 0, G_LETTER = 1, G_NUMBER = 2, G_SPACE = 3 };
#define GROUP(t, c) ((t)[c] & 3)
#define FOLD(t, c) ((t)[c] >> 2) /* 0, or 1 + index in "sdmtlver" */
enum { F_S = 1, F_D, F_M, F_T, F_L, F_V, F_E, F_R };

static uint64_t hash_bytes(const uint8_t *p, Py_ssize_t n) { /* FNV-1a */
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h | 1; /* 0 marks an empty slot */
}

static uint64_t mix(uint64_t x) { /* splitmix64 finaliser */
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27; x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

typedef struct {
    PyObject_HEAD
    uint64_t *pair_keys, *pair_vals; /* (a << 32 | b) -> (rank << 32 | new); open addressing */
    size_t pair_mask;
    uint8_t *blob; /* all token bytes */
    Py_ssize_t *tok_off, *tok_len;
    uint64_t *tok_hash; /* vocab table: slot -> hash, slot -> token id (-1 empty) */
    int32_t *tok_slot;
    size_t tok_mask;
    Py_ssize_t n_vocab;
    int32_t byte_ids[256];
    uint8_t *classes; /* N_CODEPOINTS bytes */
    int gpt4, whole;
    PyObject *long_bpe, *classes_obj;
} Engine;

static uint64_t pair_get(const Engine *e, uint32_t a, uint32_t b) {
    uint64_t key = (uint64_t)a << 32 | b;
    for (size_t s = mix(key) & e->pair_mask;; s = (s + 1) & e->pair_mask) {
        if (e->pair_vals[s] == NO_MERGE) return NO_MERGE;
        if (e->pair_keys[s] == key) return e->pair_vals[s];
    }
}

static int32_t token_get(const Engine *e, const uint8_t *p, Py_ssize_t n, uint64_t h) {
    for (size_t s = h & e->tok_mask;; s = (s + 1) & e->tok_mask) {
        int32_t id = e->tok_slot[s];
        if (id < 0) return -1;
        if (e->tok_hash[s] == h && e->tok_len[id] == n && memcmp(e->blob + e->tok_off[id], p, n) == 0)
            return id;
    }
}

/* merge.py's bpe(): ids[0..n) merged in place, leftmost lowest rank first; returns new n. */
static Py_ssize_t merge_loop(const Engine *e, int32_t *ids, uint64_t *codes, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i + 1 < n; i++) codes[i] = pair_get(e, ids[i], ids[i + 1]);
    while (n > 1) {
        Py_ssize_t best = 0;
        for (Py_ssize_t i = 1; i + 1 < n; i++)
            if (codes[i] < codes[best]) best = i;
        if (codes[best] == NO_MERGE) break;
        ids[best] = (int32_t)(codes[best] & 0xffffffffu);
        memmove(ids + best + 1, ids + best + 2, (n - best - 2) * sizeof *ids);
        memmove(codes + best, codes + best + 1, (n - best - 2) * sizeof *codes);
        n--;
        if (best + 1 < n) codes[best] = pair_get(e, ids[best], ids[best + 1]);
        if (best > 0) codes[best - 1] = pair_get(e, ids[best - 1], ids[best]);
    }
    return n;
}

#include "_fastbpe_scan.h" /* the scanners: pretokenize.py's patterns */

/* ---- one call: ids out, and a cache piece -> (where its ids were first written) ---- */

typedef struct {
    int32_t *ids;
    Py_ssize_t n, cap;
    uint64_t *c_hash; /* cache slots: hash (0 empty), piece offset and length, ids start/count */
    Py_ssize_t *c_off, *c_len, *c_out, *c_cnt;
    size_t c_mask, c_used;
    int32_t scratch[LONG_PIECE];
    uint64_t codes[LONG_PIECE];
} Call;

static int reserve(Call *c, Py_ssize_t more) {
    if (c->n + more <= c->cap) return 0;
    Py_ssize_t cap = c->cap * 2 > c->n + more ? c->cap * 2 : c->n + more + 1024;
    int32_t *p = PyMem_RawRealloc(c->ids, cap * sizeof *p);
    if (!p) return -1;
    c->ids = p, c->cap = cap;
    return 0;
}

static void cache_free(Call *c) {
    PyMem_RawFree(c->c_hash), PyMem_RawFree(c->c_off), PyMem_RawFree(c->c_len);
    PyMem_RawFree(c->c_out), PyMem_RawFree(c->c_cnt);
}

static int cache_alloc(Call *c, size_t slots) {
    c->c_hash = PyMem_RawCalloc(slots, sizeof *c->c_hash);
    c->c_off = PyMem_RawMalloc(slots * sizeof *c->c_off);
    c->c_len = PyMem_RawMalloc(slots * sizeof *c->c_len);
    c->c_out = PyMem_RawMalloc(slots * sizeof *c->c_out);
    c->c_cnt = PyMem_RawMalloc(slots * sizeof *c->c_cnt);
    c->c_mask = slots - 1, c->c_used = 0;
    if (c->c_hash && c->c_off && c->c_len && c->c_out && c->c_cnt) return 0;
    cache_free(c);
    return -1;
}

static void cache_put(Call *c, uint64_t h, Py_ssize_t off, Py_ssize_t len, Py_ssize_t out, Py_ssize_t cnt) {
    size_t s = h & c->c_mask;
    while (c->c_hash[s]) s = (s + 1) & c->c_mask;
    c->c_hash[s] = h, c->c_off[s] = off, c->c_len[s] = len, c->c_out[s] = out, c->c_cnt[s] = cnt;
    c->c_used++;
}

static int cache_grow(Call *c) { /* keep the table at most half full */
    if (2 * (c->c_used + 1) <= c->c_mask + 1) return 0;
    Call old = *c;
    if (cache_alloc(c, 2 * (old.c_mask + 1)) < 0) {
        *c = old;
        return -1;
    }
    for (size_t s = 0; s <= old.c_mask; s++)
        if (old.c_hash[s]) cache_put(c, old.c_hash[s], old.c_off[s], old.c_len[s], old.c_out[s], old.c_cnt[s]);
    cache_free(&old);
    return 0;
}

/* A long piece: merge.py's bpe_heap, called with the GIL held. */
static int long_piece(Engine *e, Call *c, const uint8_t *p, Py_ssize_t len, PyThreadState **ts) {
    PyEval_RestoreThread(*ts);
    int rc = -1;
    PyObject *out = PyObject_CallFunction(e->long_bpe, "y#", (const char *)p, len);
    if (out && PyList_Check(out) && reserve(c, PyList_GET_SIZE(out)) == 0) {
        rc = 0;
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(out) && rc == 0; k++) {
            long v = PyLong_AsLong(PyList_GET_ITEM(out, k));
            if (v < 0 || v >= e->n_vocab) rc = -1;
            else c->ids[c->n++] = (int32_t)v;
        }
    }
    if (rc < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "long-piece merge failed");
    Py_XDECREF(out);
    *ts = PyEval_SaveThread();
    return rc;
}

/* The ids of s[a:b], appended: cache, then whole-token lookup, then the merge loop. */
static int encode_piece(Engine *e, Call *c, const uint8_t *s, Py_ssize_t a, Py_ssize_t b, PyThreadState **ts) {
    const uint8_t *p = s + a;
    Py_ssize_t len = b - a;
    uint64_t h = hash_bytes(p, len);
    for (size_t k = h & c->c_mask; c->c_hash[k]; k = (k + 1) & c->c_mask)
        if (c->c_hash[k] == h && c->c_len[k] == len && memcmp(s + c->c_off[k], p, len) == 0) {
            if (reserve(c, c->c_cnt[k]) < 0) return -1;
            memcpy(c->ids + c->n, c->ids + c->c_out[k], c->c_cnt[k] * sizeof *c->ids);
            c->n += c->c_cnt[k];
            return 0;
        }
    Py_ssize_t start = c->n;
    int32_t id = e->whole ? token_get(e, p, len, h) : -1;
    if (id >= 0) {
        if (reserve(c, 1) < 0) return -1;
        c->ids[c->n++] = id;
    } else if (len > LONG_PIECE) {
        if (long_piece(e, c, p, len, ts) < 0) return -2;
    } else {
        for (Py_ssize_t k = 0; k < len; k++) c->scratch[k] = e->byte_ids[p[k]];
        Py_ssize_t m = merge_loop(e, c->scratch, c->codes, len);
        if (reserve(c, m) < 0) return -1;
        memcpy(c->ids + c->n, c->scratch, m * sizeof *c->ids);
        c->n += m;
    }
    if (cache_grow(c) < 0) return -1;
    cache_put(c, h, a, len, start, c->n - start);
    return 0;
}

static PyObject *Engine_encode(Engine *e, PyObject *text) {
    if (!e->blob) return PyErr_Format(PyExc_RuntimeError, "Engine was not built (__init__)");
    if (!PyUnicode_Check(text)) return PyErr_Format(PyExc_TypeError, "encode takes a str");
    Py_ssize_t n;
    const uint8_t *s = (const uint8_t *)PyUnicode_AsUTF8AndSize(text, &n); /* lone surrogates: UnicodeEncodeError */
    if (!s) return NULL;
    Call c = {0};
    if (cache_alloc(&c, 1024) < 0) return PyErr_NoMemory();
    int rc = 0;
    PyThreadState *ts = PyEval_SaveThread();
    for (Py_ssize_t i = 0; i < n && rc == 0;) {
        Py_ssize_t j = e->gpt4 ? gpt4_end(e->classes, s, i, n) : gpt2_end(e->classes, s, i, n);
        rc = encode_piece(e, &c, s, i, j, &ts);
        i = j;
    }
    PyEval_RestoreThread(ts);
    cache_free(&c);
    PyObject *out = NULL;
    if (rc == -1) PyErr_NoMemory();
    else if (rc == 0 && (out = PyList_New(c.n)))
        for (Py_ssize_t k = 0; k < c.n; k++) {
            PyObject *v = PyLong_FromLong(c.ids[k]);
            if (!v) { Py_CLEAR(out); break; }
            PyList_SET_ITEM(out, k, v);
        }
    PyMem_RawFree(c.ids);
    return out;
}

/* ---- building the tables ---- */

static size_t pow2_above(size_t n) {
    size_t s = 16;
    while (s < 2 * n) s *= 2;
    return s;
}

static int build_vocab(Engine *e, PyObject *vocab) {
    Py_ssize_t n = PyList_GET_SIZE(vocab), total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(vocab, i);
        if (!PyBytes_Check(t) || PyBytes_GET_SIZE(t) == 0) {
            PyErr_Format(PyExc_ValueError, "token %zd is not a non-empty bytes", i);
            return -1;
        }
        total += PyBytes_GET_SIZE(t);
    }
    e->n_vocab = n;
    e->tok_mask = pow2_above(n) - 1;
    e->blob = PyMem_RawMalloc(total + 1);
    e->tok_off = PyMem_RawMalloc((n + 1) * sizeof *e->tok_off);
    e->tok_len = PyMem_RawMalloc((n + 1) * sizeof *e->tok_len);
    e->tok_hash = PyMem_RawCalloc(e->tok_mask + 1, sizeof *e->tok_hash);
    e->tok_slot = PyMem_RawMalloc((e->tok_mask + 1) * sizeof *e->tok_slot);
    if (!e->blob || !e->tok_off || !e->tok_len || !e->tok_hash || !e->tok_slot) return -1;
    memset(e->tok_slot, 0xff, (e->tok_mask + 1) * sizeof *e->tok_slot);
    for (int b = 0; b < 256; b++) e->byte_ids[b] = -1;
    Py_ssize_t off = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(vocab, i);
        Py_ssize_t len = PyBytes_GET_SIZE(t);
        const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(t);
        memcpy(e->blob + off, p, len);
        e->tok_off[i] = off, e->tok_len[i] = len, off += len;
        if (len == 1 && e->byte_ids[p[0]] < 0) e->byte_ids[p[0]] = (int32_t)i;
        uint64_t h = hash_bytes(p, len);
        if (token_get(e, p, len, h) >= 0) continue; /* a duplicate: the first one is found */
        size_t s = h & e->tok_mask;
        while (e->tok_slot[s] >= 0) s = (s + 1) & e->tok_mask;
        e->tok_slot[s] = (int32_t)i, e->tok_hash[s] = h;
    }
    for (int b = 0; b < 256; b++)
        if (e->byte_ids[b] < 0) {
            PyErr_Format(PyExc_ValueError, "byte %d has no token", b);
            return -1;
        }
    return 0;
}

static int build_merges(Engine *e, PyObject *merges) {
    Py_ssize_t n = PyList_GET_SIZE(merges);
    e->pair_mask = pow2_above(n) - 1;
    e->pair_keys = PyMem_RawMalloc((e->pair_mask + 1) * sizeof *e->pair_keys);
    e->pair_vals = PyMem_RawMalloc((e->pair_mask + 1) * sizeof *e->pair_vals);
    if (!e->pair_keys || !e->pair_vals) return -1;
    memset(e->pair_vals, 0xff, (e->pair_mask + 1) * sizeof *e->pair_vals); /* all NO_MERGE */
    for (Py_ssize_t rank = 0; rank < n; rank++) {
        long a, b, c;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(merges, rank), "lll", &a, &b, &c)) return -1;
        if (a < 0 || b < 0 || c < 0 || a >= e->n_vocab || b >= e->n_vocab || c >= e->n_vocab) {
            PyErr_Format(PyExc_ValueError, "merge %zd names an id outside the vocabulary", rank);
            return -1;
        }
        uint64_t key = (uint64_t)a << 32 | (uint64_t)b;
        size_t s = mix(key) & e->pair_mask;
        while (e->pair_vals[s] != NO_MERGE && e->pair_keys[s] != key) s = (s + 1) & e->pair_mask;
        if (e->pair_vals[s] == NO_MERGE) e->pair_keys[s] = key, e->pair_vals[s] = (uint64_t)rank << 32 | (uint64_t)c;
    }
    return 0;
}

/* Whole-token lookup is valid when the merge loop on every token's bytes gives that token. */
static int tokens_reach_themselves(Engine *e) {
    Py_ssize_t longest = 1;
    for (Py_ssize_t i = 0; i < e->n_vocab; i++) longest = e->tok_len[i] > longest ? e->tok_len[i] : longest;
    int32_t *ids = PyMem_RawMalloc(longest * sizeof *ids);
    uint64_t *codes = PyMem_RawMalloc(longest * sizeof *codes);
    int ok = ids && codes;
    for (Py_ssize_t i = 0; ok && i < e->n_vocab; i++) {
        const uint8_t *p = e->blob + e->tok_off[i];
        for (Py_ssize_t k = 0; k < e->tok_len[i]; k++) ids[k] = e->byte_ids[p[k]];
        ok = merge_loop(e, ids, codes, e->tok_len[i]) == 1 && ids[0] == i;
    }
    PyMem_RawFree(ids), PyMem_RawFree(codes);
    return ok;
}

static void Engine_dealloc(Engine *e) {
    PyMem_RawFree(e->pair_keys), PyMem_RawFree(e->pair_vals), PyMem_RawFree(e->blob);
    PyMem_RawFree(e->tok_off), PyMem_RawFree(e->tok_len), PyMem_RawFree(e->tok_hash);
    PyMem_RawFree(e->tok_slot);
    Py_XDECREF(e->long_bpe), Py_XDECREF(e->classes_obj);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static int Engine_init(Engine *e, PyObject *args, PyObject *kw) {
    static char *names[] = {"vocab", "merges", "classes", "gpt4", "long_bpe", NULL};
    PyObject *vocab, *merges, *classes, *long_bpe;
    int gpt4;
    if (e->blob) {
        PyErr_SetString(PyExc_RuntimeError, "Engine is already built");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!SpO", names, &PyList_Type, &vocab, &PyList_Type,
                                     &merges, &classes, &gpt4, &long_bpe))
        return -1;
    if (PyBytes_GET_SIZE(classes) != N_CODEPOINTS || !PyCallable_Check(long_bpe)) {
        PyErr_SetString(PyExc_ValueError, "classes must be 0x110000 bytes and long_bpe callable");
        return -1;
    }
    if (PyList_GET_SIZE(vocab) >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "vocabulary too large");
        return -1;
    }
    Py_INCREF(classes), Py_INCREF(long_bpe);
    e->classes_obj = classes, e->long_bpe = long_bpe;
    e->classes = (uint8_t *)PyBytes_AS_STRING(classes);
    e->gpt4 = gpt4;
    if (build_vocab(e, vocab) < 0 || build_merges(e, merges) < 0) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        return -1;
    }
    e->whole = tokens_reach_themselves(e);
    return 0;
}

static PyObject *Engine_whole(Engine *e, void *closure) { return PyBool_FromLong(e->whole); }

static PyMethodDef Engine_methods[] = {
    {"encode", (PyCFunction)Engine_encode, METH_O, "encode(text) -> list of ids (the GIL is released)"},
    {NULL},
};
static PyGetSetDef Engine_getset[] = {
    {"whole_lookup", (getter)Engine_whole, NULL, "whether a piece that is a token is looked up whole", NULL},
    {NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "glassgpt.tokenizer._fastbpe.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Engine(vocab, merges, classes, gpt4, long_bpe): byte-level BPE for a named pattern",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
    .tp_getset = Engine_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastbpe", "The compiled BPE encoder.", -1};

PyMODINIT_FUNC PyInit__fastbpe(void) {
    if (PyType_Ready(&EngineType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType), Py_DECREF(m);
        return NULL;
    }
    return m;
}
