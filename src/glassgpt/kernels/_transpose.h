/* The transpose of a float32 or 16-bit matrix, for glassgpt's _rowwise extension:
 *
 *   transpose(x, y, rows, cols, threads)   y[c, r] = x[r, c] for contiguous float32 x [rows,
 *                              cols] and y [cols, rows], in 8 × 8 blocks, in parts, the GIL
 *                              released (the first operand of oneDNN's ∂W = xᵀ g)
 *   transpose16(x, y, rows, cols, threads) the same for 16-bit values (bf16, float16): an HF
 *                              file's [d_out, d_in] weights into glassgpt's [d_in, d_out]
 *
 * With AVX2 or as a portable loop, picked by pick_transpose. Include once, from _rowwise.c
 * (after _cpu.h, _parallel.h, _module.h and part_count).
 */
#ifndef GLASSGPT_TRANSPOSE_H
#define GLASSGPT_TRANSPOSE_H

/* y [cols, rows] = xᵀ for x [rows, cols]: the columns [c0, c1) of x go to rows c0… of y. */
typedef struct {
    const float *x;
    float *y;
    long long rows, cols;
} Transpose;

typedef void (*TransposeFn)(const Transpose *t, long long c0, long long c1);

/* y[c, r] = x[r, c] for r in [r0, r1), c in [c0, c1), one value at a time. */
static void transpose_values(const Transpose *t, long long r0, long long r1, long long c0,
                             long long c1) {
    for (long long r = r0; r < r1; r++)
        for (long long c = c0; c < c1; c++)
            t->y[c * t->rows + r] = t->x[r * t->cols + c];
}

static void transpose_portable(const Transpose *t, long long c0, long long c1) {
    transpose_values(t, 0, t->rows, c0, c1);
}

#if GG_X86
/* The 8 × 8 block of x at x into y, in registers. */
AVX2 static inline void transpose8(const float *x, long long ldx, float *y, long long ldy) {
    __m256 a[8], b[8];
    for (int i = 0; i < 8; i++)
        a[i] = _mm256_loadu_ps(x + i * ldx);
    for (int i = 0; i < 8; i += 2) { /* pairs of rows interleaved */
        b[i] = _mm256_unpacklo_ps(a[i], a[i + 1]);
        b[i + 1] = _mm256_unpackhi_ps(a[i], a[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) { /* then pairs of pairs */
        a[i] = _mm256_shuffle_ps(b[i], b[i + 2], 0x44);
        a[i + 1] = _mm256_shuffle_ps(b[i], b[i + 2], 0xEE);
        a[i + 2] = _mm256_shuffle_ps(b[i + 1], b[i + 3], 0x44);
        a[i + 3] = _mm256_shuffle_ps(b[i + 1], b[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) { /* then the 128-bit halves */
        _mm256_storeu_ps(y + i * ldy, _mm256_permute2f128_ps(a[i], a[i + 4], 0x20));
        _mm256_storeu_ps(y + (i + 4) * ldy, _mm256_permute2f128_ps(a[i], a[i + 4], 0x31));
    }
}

/* The columns [c0, c1): 8 × 8 blocks where whole, 32 rows at a time so that y's lines are
 * written while still in the cache; the edges one value at a time. */
AVX2 static void transpose_avx2(const Transpose *t, long long c0, long long c1) {
    const long long R8 = t->rows / 8 * 8, c8 = c0 + (c1 - c0) / 8 * 8;
    for (long long r0 = 0; r0 < R8; r0 += 32)
        for (long long c = c0; c < c8; c += 8)
            for (long long r = r0; r < r0 + 32 && r < R8; r += 8)
                transpose8(t->x + r * t->cols + c, t->cols, t->y + c * t->rows + r, t->rows);
    transpose_values(t, R8, t->rows, c0, c8);    /* the last rows of these columns */
    transpose_values(t, 0, t->rows, c8, c1); /* the last columns */
}
#endif

static TransposeFn TRANSPOSE = transpose_portable;

static void pick_transpose(int avx2) {
    TRANSPOSE = transpose_portable;
#if GG_X86
    if (avx2)
        TRANSPOSE = transpose_avx2;
#endif
}

static void transpose_part(const void *job, int part, int parts) {
    const Transpose *t = job;
    int lo, hi;
    share((int)t->cols, 8, part, parts, &lo, &hi);
    TRANSPOSE(t, lo, hi);
}

/* transpose(x, y, rows, cols, threads): y [cols, rows] = xᵀ for x [rows, cols] (float32). */
static PyObject *transpose(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[5];
    if (!int_args(args, nargs, 5, a, "transpose(x, y, rows, cols, threads)"))
        return NULL;
    if (a[2] < 0 || a[3] < 0 || a[3] > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "transpose: need rows >= 0 and 0 <= cols < 2^31");
        return NULL;
    }
    Transpose t = {(const float *)(uintptr_t)a[0], (float *)(uintptr_t)a[1], a[2], a[3]};
    Py_BEGIN_ALLOW_THREADS
    run_parts(transpose_part, &t, part_count(a[4], (int)((a[3] + 7) / 8)));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}


/* The 16-bit transpose: 8 × 8 blocks of uint16 (bf16, float16, moved as bits). */
typedef struct {
    const uint16_t *x;
    uint16_t *y;
    long long rows, cols;
} Transpose16;

typedef void (*Transpose16Fn)(const Transpose16 *t, long long c0, long long c1);

/* The columns [c0, c1) of x, 32 rows × 8 columns at a time, one value at a time. */
static void transpose16_portable(const Transpose16 *t, long long c0, long long c1) {
    for (long long r0 = 0; r0 < t->rows; r0 += 32) {
        const long long r1 = r0 + 32 < t->rows ? r0 + 32 : t->rows;
        for (long long c = c0; c < c1; c += 8) {
            const long long ce = c + 8 < c1 ? c + 8 : c1;
            for (long long r = r0; r < r1; r++)
                for (long long j = c; j < ce; j++)
                    t->y[j * t->rows + r] = t->x[r * t->cols + j];
        }
    }
}

#if GG_X86
/* The 8 × 8 block of 16-bit values at x into y, in SSE2 registers (every x86-64 has them):
 * rows interleaved by 16, 32 and 64 bits, so each output register is a column. */
static inline void transpose16_8(const uint16_t *x, long long ldx, uint16_t *y, long long ldy) {
    __m128i a[8], b[8], c[8];
    for (int i = 0; i < 8; i++)
        a[i] = _mm_loadu_si128((const __m128i *)(x + i * ldx));
    for (int i = 0; i < 8; i += 2) {
        b[i] = _mm_unpacklo_epi16(a[i], a[i + 1]);
        b[i + 1] = _mm_unpackhi_epi16(a[i], a[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        c[i] = _mm_unpacklo_epi32(b[i], b[i + 2]);     /* columns 0, 1 of rows i … i + 3 */
        c[i + 1] = _mm_unpackhi_epi32(b[i], b[i + 2]); /* columns 2, 3 */
        c[i + 2] = _mm_unpacklo_epi32(b[i + 1], b[i + 3]);
        c[i + 3] = _mm_unpackhi_epi32(b[i + 1], b[i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        _mm_storeu_si128((__m128i *)(y + (2 * i) * ldy), _mm_unpacklo_epi64(c[i], c[i + 4]));
        _mm_storeu_si128((__m128i *)(y + (2 * i + 1) * ldy), _mm_unpackhi_epi64(c[i], c[i + 4]));
    }
}

static void transpose16_sse2(const Transpose16 *t, long long c0, long long c1) {
    const long long R8 = t->rows / 8 * 8, c8 = c0 + (c1 - c0) / 8 * 8;
    for (long long r0 = 0; r0 < R8; r0 += 32)
        for (long long c = c0; c < c8; c += 8)
            for (long long r = r0; r < r0 + 32 && r < R8; r += 8)
                transpose16_8(t->x + r * t->cols + c, t->cols, t->y + c * t->rows + r, t->rows);
    for (long long r = R8; r < t->rows; r++) /* the last rows of these columns */
        for (long long j = c0; j < c8; j++)
            t->y[j * t->rows + r] = t->x[r * t->cols + j];
    Transpose16 rest = *t; /* the last columns */
    transpose16_portable(&rest, c8, c1);
}
#endif

static Transpose16Fn TRANSPOSE16 = transpose16_portable;

/* SSE2 blocks unless the portable loops are forced (``fast`` 0; every x86-64 has SSE2). */
static void pick_transpose16(int fast) {
    TRANSPOSE16 = transpose16_portable;
#if GG_X86
    if (fast)
        TRANSPOSE16 = transpose16_sse2;
#endif
}

static void transpose16_part(const void *job, int part, int parts) {
    const Transpose16 *t = job;
    int lo, hi;
    share((int)t->cols, 8, part, parts, &lo, &hi);
    TRANSPOSE16(t, lo, hi);
}

/* transpose16(x, y, rows, cols, threads): y [cols, rows] = xᵀ for x [rows, cols] (16-bit). */
static PyObject *transpose16(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[5];
    if (!int_args(args, nargs, 5, a, "transpose16(x, y, rows, cols, threads)"))
        return NULL;
    if (a[2] < 0 || a[3] < 0 || a[3] > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "transpose16: need rows >= 0 and 0 <= cols < 2^31");
        return NULL;
    }
    Transpose16 t = {(const uint16_t *)(uintptr_t)a[0], (uint16_t *)(uintptr_t)a[1], a[2], a[3]};
    Py_BEGIN_ALLOW_THREADS
    run_parts(transpose16_part, &t, part_count(a[4], (int)((a[3] + 7) / 8)));
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

#endif
