/* The int4 weight-only product of glassgpt.kernels.int4, for a few rows of x (decoding).
 *
 *     y[m, j] = Σ_g d[j, g] · Σ_{i in group g} x[m, i] q[j, i] + b[j]
 *
 * q ∈ [−8, 7] in groups of 32 inputs, one float16 scale d[j, g] per group: W̃[i, j] = q d.
 * x float32 [M, d_in], b float32 [d_out] or none, y float32 [M, d_out]. The weights are
 * laid out in blocks of 16 output channels (a panel) by 32 inputs (a group), one block of
 * 288 bytes: four 64-byte lines, line l holding inputs 8l .. 8l+7 as byte 64 l + 4 c + k =
 * u[c, 8l+k] | u[c, 8l+4+k] << 4 (u = q + 8, channel c of the panel, k < 4), then the
 * block's 16 float16 scales. So a line's low nibbles are, per 32-bit lane, one channel's four
 * consecutive inputs (what vpdpbusd multiplies), and its high nibbles the next four. A
 * panel's blocks follow each other: a thread streams its panels front to back (4.5 bits a
 * weight).
 *
 * Two arithmetics, a kernel family each:
 * - int8 x (the default; llama.cpp's Q8 activations): each row's group of 32 inputs is
 *   rounded once per call to x8 = rint(x / s) ∈ [−127, 127] with s = max |x| / 127 (float32
 *   division, round half to even; a group of zeros has s = 0, one with a non-finite entry
 *   s = NaN). Σ u x8 over a group is an exact integer sum (|·| ≤ 32 · 15 · 127), from which
 *   8 Σ x8 is taken back (u = q + 8), so y = Σ_g (d s) · Σ_i q x8 + b, in float32 after the
 *   integer sums: x W̃ + b for x̃ = s x8, the rounded x, to float32 rounding (the tests' oracle
 *   rounds x the same way). Decoding is then bound by memory, not by turning nibbles into
 *   floats: 64 products an instruction (VNNI) against 16.
 * - float (a choice, for exactness): a nibble becomes its float value q exactly, each
 *   group's Σ x q is summed in float32 and scaled by d once: x W̃ + b to float32 rounding,
 *   no rounding of x.
 *
 * Kernels, chosen at run time (__builtin_cpu_supports), each forced in turn by the tests:
 * - vnni: AVX-512 with VNNI, int8 x: a line's nibbles masked to bytes, vpdpbusd against the
 *   broadcast four bytes of x8; M ≤ 8 rows share each line.
 * - avx512 (AVX-512BW) and avx2, int8 x: vpmaddubsw (pairs of u · x8, |·| ≤ 3810) summed in
 *   16 bits over the group's 8 (|·| ≤ 30480 < 2^15), then one vpmaddwd by ones to 32 bits.
 * - scalar: the portable loop, int8 x.
 * - float-avx512 (16 channels a vector, a nibble → float by one vpermps from a 16-entry
 *   table), float-avx2 (8 a vector: mask, shift, subtract 8, convert), float-scalar.
 * Threads: whole panels split over PyTorch's own OpenMP threads (_parallel.h); GIL released.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#include "_program.h" /* KernelEntry, run_slots(), export_impls() */

#include "_parallel.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

#define MAX_ROWS 8
#define MAX_THREADS 256
#define PANEL 16           /* output channels a block */
#define GROUP 32           /* inputs a block (a scale's group) */
#define NIBBLES 256        /* bytes of a block's weights */
#define BLOCK_BYTES 288    /* + 16 float16 scales */

typedef struct Job {
    const float *x;      /* float kernels: [M, G * 32], zero past d_in */
    const int32_t *xq;   /* int8 kernels: x8 [M, G * 32] as bytes, four to a word */
    const float *sx;     /* x8's scales s [M, G] */
    const int32_t *corr; /* −8 Σ x8 over each group [M, G] (u = q + 8) */
    const uint8_t *w;    /* [P, G, 288] */
    const float *b;      /* or NULL */
    float *y;
    Py_ssize_t M, G, d_out;
    void (*kernel)(const struct Job *, Py_ssize_t p0, Py_ssize_t p1);
} Job;

typedef void (*Kernel)(const Job *, Py_ssize_t p0, Py_ssize_t p1);

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, f = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)f, -24);
    else if (e == 31) v = f ? NAN : INFINITY;
    else v = ldexpf((float)(f | 1024), (int)e - 25);
    return sign ? -v : v;
}

/* y[m, j] for the panel's sums (j < d_out), plus the bias */
static inline void store(const Job *J, Py_ssize_t p, Py_ssize_t m, const float *acc) {
    for (int c = 0; c < PANEL && p * PANEL + c < J->d_out; c++) {
        Py_ssize_t j = p * PANEL + c;
        J->y[m * J->d_out + j] = acc[c] + (J->b ? J->b[j] : 0.0f);
    }
}

/* the weight of channel c at input i of a block (i < 32), as u = q + 8 */
static inline int nibble(const uint8_t *blk, int c, int i) {
    uint8_t v = blk[64 * (i / 8) + 4 * c + i % 4];
    return (i % 8) < 4 ? v & 15 : v >> 4;
}

/* ---- portable kernels --------------------------------------------------------------- */

static void float_scalar(const Job *J, Py_ssize_t p0, Py_ssize_t p1) {
    const Py_ssize_t G = J->G, W = G * GROUP;
    for (Py_ssize_t p = p0; p < p1; p++)
        for (Py_ssize_t m = 0; m < J->M; m++) {
            float y[PANEL] = {0};
            const float *x = J->x + m * W;
            for (Py_ssize_t g = 0; g < G; g++) {
                const uint8_t *blk = J->w + (p * G + g) * BLOCK_BYTES;
                const uint16_t *d = (const uint16_t *)(blk + NIBBLES);
                for (int c = 0; c < PANEL; c++) {
                    float acc = 0.0f;
                    for (int i = 0; i < GROUP; i++)
                        acc += x[g * GROUP + i] * (float)(nibble(blk, c, i) - 8);
                    y[c] += acc * half_to_float(d[c]);
                }
            }
            store(J, p, m, y);
        }
}

static void int8_scalar(const Job *J, Py_ssize_t p0, Py_ssize_t p1) {
    const Py_ssize_t G = J->G, W = G * GROUP;
    for (Py_ssize_t p = p0; p < p1; p++)
        for (Py_ssize_t m = 0; m < J->M; m++) {
            float y[PANEL] = {0};
            const int8_t *x = (const int8_t *)J->xq + m * W;
            for (Py_ssize_t g = 0; g < G; g++) {
                const uint8_t *blk = J->w + (p * G + g) * BLOCK_BYTES;
                const uint16_t *d = (const uint16_t *)(blk + NIBBLES);
                const float s = J->sx[m * G + g];
                for (int c = 0; c < PANEL; c++) {
                    int32_t acc = J->corr[m * G + g];
                    for (int i = 0; i < GROUP; i++) acc += nibble(blk, c, i) * x[g * GROUP + i];
                    y[c] += (float)acc * (half_to_float(d[c]) * s);
                }
            }
            store(J, p, m, y);
        }
}

#if HAVE_X86
#define PREFETCH_BLOCK(blk)                                                                   \
    do {                                                                                      \
        for (int o_ = 0; o_ < BLOCK_BYTES; o_ += 64)                                          \
            _mm_prefetch((const char *)(blk) + 4 * BLOCK_BYTES + o_, _MM_HINT_T0);           \
    } while (0)

/* ---- AVX2 kernels: 8 channels a vector (two per panel), rows in twos ------------------- */
#define T2 __attribute__((target("avx2,fma,f16c")))

/* the panels p0..p1 of an AVX2 kernel, rows in pairs (R of them): y[r] zeroed, the body run
 * on each block blk of group g (prefetched 4 ahead), y + b stored */
#define PANELS_ROW_PAIRS(...)                                                                 \
    for (Py_ssize_t p = p0; p < p1; p++)                                                      \
        for (Py_ssize_t m0 = 0; m0 < M; m0 += 2) {                                            \
            const int R = M - m0 < 2 ? (int)(M - m0) : 2;                                     \
            float y[2][PANEL] = {{0}};                                                        \
            for (Py_ssize_t g = 0; g < G; g++) {                                              \
                const uint8_t *blk = J->w + (p * G + g) * BLOCK_BYTES;                        \
                PREFETCH_BLOCK(blk);                                                          \
                __VA_ARGS__                                                                   \
            }                                                                                 \
            for (int r = 0; r < R; r++) store(J, p, m0 + r, y[r]);                            \
        }

T2 static void float_avx2(const Job *J, Py_ssize_t p0, Py_ssize_t p1) {
    const Py_ssize_t G = J->G, W = G * GROUP, M = J->M;
    const __m256i low = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
    PANELS_ROW_PAIRS(
        __m256 acc[2][2][2]; /* row, half, low/high nibbles */
        for (int r = 0; r < 2; r++)
            for (int h = 0; h < 2; h++)
                acc[r][h][0] = acc[r][h][1] = _mm256_setzero_ps();
        for (int l = 0; l < 4; l++)
            for (int h = 0; h < 2; h++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 64 * l + 32 * h));
                for (int k = 0; k < 4; k++) {
                    __m256i b = _mm256_srli_epi32(v, 8 * k);
                    __m256 wl = _mm256_cvtepi32_ps(
                        _mm256_sub_epi32(_mm256_and_si256(b, low), eight));
                    __m256 wh = _mm256_cvtepi32_ps(_mm256_sub_epi32(
                        _mm256_and_si256(_mm256_srli_epi32(b, 4), low), eight));
                    for (int r = 0; r < R; r++) {
                        const float *x = J->x + (m0 + r) * W + g * GROUP + 8 * l + k;
                        acc[r][h][0] = _mm256_fmadd_ps(wl, _mm256_broadcast_ss(x),
                                                       acc[r][h][0]);
                        acc[r][h][1] = _mm256_fmadd_ps(wh, _mm256_broadcast_ss(x + 4),
                                                       acc[r][h][1]);
                    }
                }
            }
        for (int h = 0; h < 2; h++) {
            __m256 d = _mm256_cvtph_ps(
                _mm_loadu_si128((const __m128i *)(blk + NIBBLES + 16 * h)));
            for (int r = 0; r < R; r++) {
                __m256 s = _mm256_add_ps(acc[r][h][0], acc[r][h][1]);
                _mm256_storeu_ps(y[r] + 8 * h,
                                 _mm256_fmadd_ps(s, d, _mm256_loadu_ps(y[r] + 8 * h)));
            }
        }
    )
}

T2 static void int8_avx2(const Job *J, Py_ssize_t p0, Py_ssize_t p1) {
    const Py_ssize_t G = J->G, W4 = G * GROUP / 4, M = J->M;
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    PANELS_ROW_PAIRS(
        __m256i acc[2][2]; /* row, half: Σ u x8 in 16 bits */
        for (int r = 0; r < 2; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
        for (int l = 0; l < 4; l++)
            for (int h = 0; h < 2; h++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 64 * l + 32 * h));
                __m256i lo = _mm256_and_si256(v, low);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                for (int r = 0; r < R; r++) {
                    const int32_t *x = J->xq + (m0 + r) * W4 + g * (GROUP / 4) + 2 * l;
                    __m256i s = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, _mm256_set1_epi32(x[0])),
                        _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x[1])));
                    acc[r][h] = _mm256_add_epi16(acc[r][h], s);
                }
            }
        for (int h = 0; h < 2; h++) {
            __m256 d = _mm256_cvtph_ps(
                _mm_loadu_si128((const __m128i *)(blk + NIBBLES + 16 * h)));
            for (int r = 0; r < R; r++) {
                const Py_ssize_t mg = (m0 + r) * G + g;
                __m256i a = _mm256_add_epi32(_mm256_madd_epi16(acc[r][h], ones),
                                             _mm256_set1_epi32(J->corr[mg]));
                __m256 sc = _mm256_mul_ps(d, _mm256_set1_ps(J->sx[mg]));
                _mm256_storeu_ps(y[r] + 8 * h, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), sc,
                                                               _mm256_loadu_ps(y[r] + 8 * h)));
            }
        }
    )
}

/* ---- AVX-512 kernels: 16 channels a vector, all M rows at once --------------------------- */
#define T5 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw")))
#define T5V __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vnni")))

/* the panels p0..p1 of a 16-channel AVX-512 kernel of M rows: y[r] zeroed, the body run on
 * each block blk of group g (prefetched 4 ahead), y + b stored */
#define PANELS512(M, ...)                                                                     \
    for (Py_ssize_t p = p0; p < p1; p++) {                                                    \
        __m512 y[M];                                                                          \
        _Pragma("GCC unroll 8") for (int r = 0; r < M; r++) y[r] = _mm512_setzero_ps();        \
        const uint8_t *blk = J->w + p * G * BLOCK_BYTES;                                      \
        for (Py_ssize_t g = 0; g < G; g++, blk += BLOCK_BYTES) {                              \
            PREFETCH_BLOCK(blk);                                                              \
            __VA_ARGS__                                                                       \
        }                                                                                     \
        for (int r = 0; r < M; r++) {                                                         \
            float out[PANEL];                                                                 \
            _mm512_storeu_ps(out, y[r]);                                                      \
            store(J, p, r, out);                                                              \
        }                                                                                     \
    }

/* float: an FMA's latency is 4 cycles, so one row needs 4 independent sums, two rows 2 each,
 * more rows 1. Line l: byte k of each lane (shifted down by 8k) holds inputs 8l+k (low
 * nibble, which vpermps reads as its index) and 8l+4+k (high). */
#define FLOAT512(M, C)                                                                        \
    T5 static void float512_##M(const Job *J, Py_ssize_t p0, Py_ssize_t p1) {                 \
        const Py_ssize_t G = J->G, W = G * GROUP;                                             \
        const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5,  \
                                            6, 7);                                            \
        PANELS512(M, {                                                                        \
            __m512 acc[C][M];                                                                 \
            _Pragma("GCC unroll 4") for (int k = 0; k < C; k++)                               \
            _Pragma("GCC unroll 8") for (int r = 0; r < M; r++) acc[k][r] = _mm512_setzero_ps(); \
            const float *xg = J->x + g * GROUP;                                               \
            _Pragma("GCC unroll 4") for (int l = 0; l < 4; l++) {                             \
                __m512i v = _mm512_loadu_si512((const void *)(blk + 64 * l));                 \
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {                         \
                    __m512i b = _mm512_srli_epi32(v, 8 * k);                                  \
                    __m512 lo = _mm512_permutexvar_ps(b, table);                              \
                    __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);        \
                    _Pragma("GCC unroll 8") for (int r = 0; r < M; r++) {                     \
                        const float *x = xg + r * W + 8 * l + k;                              \
                        acc[(2 * k) % C][r] =                                                 \
                            _mm512_fmadd_ps(lo, _mm512_set1_ps(x[0]), acc[(2 * k) % C][r]);   \
                        acc[(2 * k + 1) % C][r] =                                             \
                            _mm512_fmadd_ps(hi, _mm512_set1_ps(x[4]), acc[(2 * k + 1) % C][r]); \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + NIBBLES))); \
            _Pragma("GCC unroll 8") for (int r = 0; r < M; r++) {                             \
                __m512 a = acc[0][r];                                                         \
                _Pragma("GCC unroll 4") for (int k = 1; k < C; k++) a = _mm512_add_ps(a, acc[k][r]); \
                y[r] = _mm512_fmadd_ps(a, d, y[r]);                                           \
            }                                                                                 \
        })                                                                                    \
    }

/* int8 x: one line's low and high nibbles against the row's two broadcast words of x8.
 * VNNI: vpdpbusd into two 32-bit sums a row. BW: vpmaddubsw, summed in 16 bits. */
#define LINE_VNNI(r, lo, hi, x)                                                               \
    do {                                                                                      \
        acc[0][r] = _mm512_dpbusd_epi32(acc[0][r], lo, _mm512_set1_epi32((x)[0]));           \
        acc[1][r] = _mm512_dpbusd_epi32(acc[1][r], hi, _mm512_set1_epi32((x)[1]));           \
    } while (0)
#define LINE_BW(r, lo, hi, x)                                                                 \
    do {                                                                                      \
        acc[0][r] = _mm512_add_epi16(                                                         \
            acc[0][r], _mm512_add_epi16(_mm512_maddubs_epi16(lo, _mm512_set1_epi32((x)[0])),  \
                                        _mm512_maddubs_epi16(hi, _mm512_set1_epi32((x)[1])))); \
    } while (0)
#define SUM_VNNI(r) _mm512_add_epi32(acc[0][r], acc[1][r])
#define SUM_BW(r) _mm512_madd_epi16(acc[0][r], ones)

#define INT8_512(NAME, TGT, LINE, SUM, C, M)                                                  \
    TGT static void NAME##_##M(const Job *J, Py_ssize_t p0, Py_ssize_t p1) {                  \
        const Py_ssize_t G = J->G, W4 = G * GROUP / 4;                                        \
        const __m512i low = _mm512_set1_epi8(15), ones = _mm512_set1_epi16(1);                \
        (void)ones;                                                                           \
        PANELS512(M, {                                                                        \
            __m512i acc[C][M];                                                                \
            _Pragma("GCC unroll 2") for (int k = 0; k < C; k++)                               \
            _Pragma("GCC unroll 8") for (int r = 0; r < M; r++) acc[k][r] = _mm512_setzero_si512(); \
            const int32_t *xg = J->xq + g * (GROUP / 4);                                      \
            _Pragma("GCC unroll 4") for (int l = 0; l < 4; l++) {                             \
                __m512i v = _mm512_loadu_si512((const void *)(blk + 64 * l));                 \
                __m512i lo = _mm512_and_si512(v, low);                                        \
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);                  \
                _Pragma("GCC unroll 8") for (int r = 0; r < M; r++)                           \
                    LINE(r, lo, hi, xg + r * W4 + 2 * l);                                     \
            }                                                                                 \
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + NIBBLES))); \
            _Pragma("GCC unroll 8") for (int r = 0; r < M; r++) {                             \
                __m512i a = _mm512_add_epi32(SUM(r), _mm512_set1_epi32(J->corr[r * G + g]));  \
                __m512 s = _mm512_mul_ps(d, _mm512_set1_ps(J->sx[r * G + g]));                \
                y[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a), s, y[r]);                       \
            }                                                                                 \
        })                                                                                    \
    }

#define BY_ROWS(NAME)                                                                         \
    static void NAME(const Job *J, Py_ssize_t p0, Py_ssize_t p1) {                            \
        static const Kernel by_rows[MAX_ROWS + 1] = {NULL,      NAME##_1, NAME##_2, NAME##_3, \
                                                     NAME##_4, NAME##_5, NAME##_6, NAME##_7,  \
                                                     NAME##_8};                               \
        by_rows[J->M](J, p0, p1);                                                             \
    }

FLOAT512(1, 4)
FLOAT512(2, 2)
FLOAT512(3, 2)
FLOAT512(4, 2)
FLOAT512(5, 1)
FLOAT512(6, 1)
FLOAT512(7, 1)
FLOAT512(8, 1)
BY_ROWS(float512)

#define EACH_M(NAME, TGT, LINE, SUM, C)                                                       \
    INT8_512(NAME, TGT, LINE, SUM, C, 1)                                                      \
    INT8_512(NAME, TGT, LINE, SUM, C, 2)                                                      \
    INT8_512(NAME, TGT, LINE, SUM, C, 3)                                                      \
    INT8_512(NAME, TGT, LINE, SUM, C, 4)                                                      \
    INT8_512(NAME, TGT, LINE, SUM, C, 5)                                                      \
    INT8_512(NAME, TGT, LINE, SUM, C, 6)                                                      \
    INT8_512(NAME, TGT, LINE, SUM, C, 7)                                                      \
    INT8_512(NAME, TGT, LINE, SUM, C, 8)                                                      \
    BY_ROWS(NAME)

EACH_M(vnni512, T5V, LINE_VNNI, SUM_VNNI, 2)
EACH_M(bw512, T5, LINE_BW, SUM_BW, 1)
#endif

/* the kernels, best first; int8: whether it reads x8 (else float x) */
static const struct {
    const char *name;
    Kernel run;
    int int8;
} KERNELS[] = {
#if HAVE_X86
    {"vnni", vnni512, 1},
    {"avx512", bw512, 1},
    {"avx2", int8_avx2, 1},
#endif
    {"scalar", int8_scalar, 1},
#if HAVE_X86
    {"float-avx512", float512, 0},
    {"float-avx2", float_avx2, 0},
#endif
    {"float-scalar", float_scalar, 0},
};
#define N_KERNELS ((int)(sizeof KERNELS / sizeof KERNELS[0]))

static int KERNEL = -1; /* index into KERNELS */

static int runs_here(const char *name) {
#if HAVE_X86
    __builtin_cpu_init();
    int has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    int has5 = has2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    if (!strcmp(name, "vnni")) return has5 && __builtin_cpu_supports("avx512vnni");
    if (!strcmp(name, "avx512") || !strcmp(name, "float-avx512")) return has5;
    if (!strcmp(name, "avx2") || !strcmp(name, "float-avx2")) return has2;
#endif
    return 1;
}

/* the best kernel this CPU runs, or the one named (−1 if unknown or the CPU lacks it) */
static int pick(const char *want) {
    for (int i = 0; i < N_KERNELS; i++)
        if ((!want || !strcmp(want, KERNELS[i].name)) && runs_here(KERNELS[i].name)) return i;
    return -1;
}

/* ---- the threads ------------------------------------------------------------------ */

static void part(const void *job, int k, int parts) {
    const Job *J = job;
    int p0, p1;
    share((int)((J->d_out + PANEL - 1) / PANEL), 1, k, parts, &p0, &p1);
    if (p0 < p1) J->kernel(J, p0, p1);
}

static void run(const Job *J, int threads) {
    /* a part per thread, none smaller than 32 KiB of weights */
    Py_ssize_t max_parts = ((J->d_out + PANEL - 1) / PANEL) * J->G * BLOCK_BYTES / 32768;
    if (threads > max_parts) threads = max_parts > 1 ? (int)max_parts : 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    run_parts(part, J, threads);
}

/* ---- quantization (int4.quantize's arithmetic, fast) ---------------------------------- */

/* float → float16 bits, round to nearest even (|f| ≤ 65504 or NaN) */
static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, a = x & 0x7fffffff;
    if (a > 0x7f800000) return (uint16_t)(sign | 0x7e00);
    if (a >= 0x47800000) return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000) /* a float16 subnormal (or zero): multiples of 2^-24 */
        return (uint16_t)(sign | (uint32_t)lrintf(fabsf(f) * 16777216.0f));
    uint32_t r = a - 0x38000000, h = r >> 13, rest = r & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

typedef struct {
    const float *W; /* [d_out, G * 32], zeros past d_in */
    int8_t *q;      /* [d_out, G * 32] */
    uint16_t *d;    /* [d_out, G] */
    const float *c; /* candidates: d = c m */
    int n_c;
    Py_ssize_t d_out, G;
} QJob;

/* Each group: of the candidates d = fp16(c · m), m the signed largest-magnitude weight (the
 * first), the one of least Σ (W − q d)², q = clamp(rint(W / d), −8, 7) (0 for d = 0); the
 * first on ties. */
static void quantize_part(const void *job, int k, int parts) {
    const QJob *Q = job;
    int r0, r1;
    share((int)Q->d_out, 1, k, parts, &r0, &r1);
    for (Py_ssize_t gi = (Py_ssize_t)r0 * Q->G; gi < (Py_ssize_t)r1 * Q->G; gi++) {
        const float *w = Q->W + gi * GROUP;
        float m = 0.0f;
        for (int i = 0; i < GROUP; i++)
            if (fabsf(w[i]) > fabsf(m)) m = w[i];
        double best = INFINITY;
        uint16_t best_h = 0;
        for (int c = 0; c < Q->n_c; c++) {
            float v = Q->c[c] * m;
            v = v > 65504.0f ? 65504.0f : v < -65504.0f ? -65504.0f : v;
            uint16_t h = float_to_half(v);
            float d = half_to_float(h);
            double err = 0.0;
            for (int i = 0; i < GROUP; i++) {
                float q = d != 0.0f ? rintf(w[i] / d) : 0.0f;
                q = q > 7.0f ? 7.0f : q < -8.0f ? -8.0f : q;
                double e = (double)w[i] - (double)(q * d);
                err += e * e;
            }
            if (err < best) best = err, best_h = h;
        }
        float d = half_to_float(best_h);
        for (int i = 0; i < GROUP; i++) {
            float q = d != 0.0f ? rintf(w[i] / d) : 0.0f;
            Q->q[gi * GROUP + i] = (int8_t)(q > 7.0f ? 7.0f : q < -8.0f ? -8.0f : q);
        }
        Q->d[gi] = best_h;
    }
}

static PyObject *quantize(PyObject *self, PyObject *args) {
    unsigned long long W, q, d, c;
    Py_ssize_t d_out, G;
    int n_c, threads;
    if (!PyArg_ParseTuple(args, "KKKKinni", &W, &q, &d, &c, &n_c, &d_out, &G, &threads))
        return NULL;
    if (!W || !q || !d || !c || n_c < 1 || d_out < 0 || G < 0) {
        PyErr_SetString(PyExc_ValueError, "quantize: bad arguments");
        return NULL;
    }
    QJob Q = {(const float *)(uintptr_t)W, (int8_t *)(uintptr_t)q, (uint16_t *)(uintptr_t)d,
              (const float *)(uintptr_t)c, n_c, d_out, G};
    if (threads > d_out) threads = d_out > 1 ? (int)d_out : 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    Py_BEGIN_ALLOW_THREADS run_parts(quantize_part, &Q, threads);
    Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* ---- Python ------------------------------------------------------------------------- */

/* x8, s and −8 Σ x8 of each row's groups of 32 (zeros past d_in): s = max |x| / 127,
 * x8 = rint(x / s); s = 0 for a group of zeros, NaN for one with a non-finite entry (x8 = 0,
 * so that the group's products are NaN) */
static void round_x(const float *x, Py_ssize_t M, Py_ssize_t d_in, Py_ssize_t G, int8_t *xq,
                    float *sx, int32_t *corr) {
    for (Py_ssize_t m = 0; m < M; m++)
        for (Py_ssize_t g = 0; g < G; g++) {
            const float *v = x + m * d_in + g * GROUP;
            int8_t *o = xq + (m * G + g) * GROUP;
            const int n = d_in - g * GROUP < GROUP ? (int)(d_in - g * GROUP) : GROUP;
            float amax = 0.0f;
            int finite = 1;
            for (int i = 0; i < n; i++) {
                finite &= isfinite(v[i]) != 0;
                amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
            }
            const float s = !finite ? NAN : amax / 127.0f;
            int32_t sum = 0;
            for (int i = 0; i < GROUP; i++) {
                float r = i < n && s > 0.0f ? rintf(v[i] / s) : 0.0f;
                r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
                o[i] = (int8_t)r, sum += (int32_t)r;
            }
            sx[m * G + g] = s, corr[m * G + g] = -8 * sum;
        }
}

/* The slots: x, w, b, y, M, d_in, d_out, threads. */
static int gemv_impl(const long long *a, const double *unused, KernelError *err) {
    const Py_ssize_t M = (Py_ssize_t)a[4], d_in = (Py_ssize_t)a[5], d_out = (Py_ssize_t)a[6];
    if (M < 1 || M > MAX_ROWS || d_in < 0 || d_out < 0 || !a[0] || !a[1] || !a[3])
        return kernel_fail(err, KERR_VALUE,
                           "gemv: need 1 ≤ M ≤ 8, sizes ≥ 0 and non-null buffers");
    const Py_ssize_t G = (d_in + GROUP - 1) / GROUP, Wd = G * GROUP;
    const float *xf = (const float *)(uintptr_t)a[0];
    Job J = {NULL, NULL, NULL, NULL, (const uint8_t *)(uintptr_t)a[1], (const float *)(uintptr_t)a[2],
             (float *)(uintptr_t)a[3], M, G, d_out, KERNELS[KERNEL].run};
    void *buf;
    if (KERNELS[KERNEL].int8) { /* x8 [M, Wd] bytes, then s and −8 Σ x8 [M, G] */
        buf = PyMem_RawMalloc((size_t)(M * Wd + 8 * M * G + 4));
        if (!buf) return kernel_fail(err, KERR_MEMORY, "out of memory");
        float *sx = (float *)((char *)buf + M * Wd);
        int32_t *corr = (int32_t *)(sx + M * G);
        round_x(xf, M, d_in, G, buf, sx, corr);
        J.xq = buf, J.sx = sx, J.corr = corr;
    } else { /* x copied into rows of whole groups, zeros past d_in (the weights are 0 too) */
        float *xp = buf = PyMem_RawCalloc((size_t)(M * Wd > 0 ? M * Wd : 1), sizeof(float));
        if (!xp) return kernel_fail(err, KERR_MEMORY, "out of memory");
        for (Py_ssize_t m = 0; m < M; m++) memcpy(xp + m * Wd, xf + m * d_in, sizeof(float) * d_in);
        J.x = xp;
    }
    run(&J, (int)a[7]);
    PyMem_RawFree(buf);
    return 0;
}

static const KernelEntry GEMV = {"gemv", "iiiiiiii", gemv_impl, 1,
                                 "gemv(x, w, b, y, M, d_in, d_out, threads)"};

/* The Python arguments parsed as before (PyArg_ParseTuple's types), then into GEMV's slots. */
static PyObject *gemv(PyObject *self, PyObject *args) {
    unsigned long long x, w, b, y;
    Py_ssize_t M, d_in, d_out;
    int threads;
    if (!PyArg_ParseTuple(args, "KKKKnnni", &x, &w, &b, &y, &M, &d_in, &d_out, &threads))
        return NULL;
    const long long a[8] = {(long long)x, (long long)w, (long long)b, (long long)y,
                            M, d_in, d_out, threads};
    return run_slots(&GEMV, a, NULL);
}

static const KernelEntry *const IMPLS[] = {&GEMV, NULL};

static PyObject *use(PyObject *self, PyObject *arg) { /* tests: force a kernel, None: best */
    const char *want = NULL;
    if (arg != Py_None && !(want = PyUnicode_AsUTF8(arg))) return NULL;
    int k = pick(want);
    if (k < 0) {
        PyErr_Format(PyExc_ValueError, "this CPU has no %s kernel", want);
        return NULL;
    }
    KERNEL = k; /* tests only: no call may be in flight */
    return PyUnicode_FromString(KERNELS[KERNEL].name);
}

static PyObject *kernel_name(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(KERNELS[KERNEL].name);
}

static PyObject *kernel_names(PyObject *self, PyObject *unused) {
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < N_KERNELS; i++) {
        PyObject *name = PyUnicode_FromString(KERNELS[i].name);
        if (!name || PyList_Append(out, name) < 0) Py_CLEAR(out);
        Py_XDECREF(name);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"gemv", gemv, METH_VARARGS,
     "gemv(x, w, b, y, M, d_in, d_out, threads): y = x W̃ + b, W̃ in blocks w [d_out/16, "
     "d_in/32 (rounded up), 288 bytes]; addresses as ints, b 0 for none (GIL released)"},
    {"quantize", quantize, METH_VARARGS,
     "quantize(W, q, d, c, n_c, d_out, G, threads): int4.quantize's groups (addresses as ints)"},
    {"kernel", kernel_name, METH_NOARGS, "the kernel in use ('vnni', ..., 'float-scalar')"},
    {"kernels", kernel_names, METH_NOARGS, "every kernel compiled here, best first"},
    {"use", use, METH_O, "use(name or None): force a kernel (tests); returns the one in use"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_int4",
                                    "The int4 weight-only product for a few rows.", -1, methods};

PyMODINIT_FUNC PyInit__int4(void) {
    KERNEL = pick(NULL);
    return export_impls(PyModule_Create(&module), IMPLS);
}
