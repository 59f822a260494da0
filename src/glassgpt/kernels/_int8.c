/* The int8 weight-only product of glassgpt.kernels.int8, for a few rows of x (decoding).
 *
 *     y[m, j] = s[j] · Σ_i x[m, i] q[j, i] + b[j]        m < M, j < d_out, i < d_in
 *
 * x float32 [M, d_in], s float32 [d_out], b float32 [d_out] or none, y float32 [M, d_out];
 * q int8 in groups of 32 output channels and pairs of inputs, p[⌈d_out/32⌉, ⌈d_in/2⌉, 32, 2]
 * with p[j/32, i/2, j%32, i%2] = q[j, i] (zeros past d_out and d_in): the 64 weights of a
 * group at inputs 2t, 2t+1 are one 64-byte line, and a group is one run of memory that a
 * thread streams front to back (one stream, where panels of 8 channels one after another
 * were four: 16.8 GB/s over GPT-2 small's block matrices at M = 1). The kernel works in
 * panels of 8 channels, a quarter of a group's line: panel p is channels 8p .. 8p+7.
 *
 * Each row of x is first rounded to 16-bit integers with one scale per row,
 * x[m, i] ≈ r[m] x16[m, i], r[m] = max_i |x[m, i]| / 32767, so |x − r x16| ≤ r/2 (plus
 * float32 rounding: a relative error of 2^-16 of the row's largest entry, far below the
 * weights' own rounding). The sums
 * Σ_i x16[m, i] q[j, i] are exact integer sums (32-bit, emptied into float32 every 512
 * inputs, before they can overflow), then y[m, j] = (sum · r[m]) · s[j] + b[j] in float32.
 * A row of x with a non-finite entry gives a row of NaN.
 *
 * At M ≤ 8 the product is bound by reading q (M = 1) or by its multiply-adds (M = 8 does 16
 * per weight byte): each panel is read once for all M rows; 16 weights are widened
 * int8 → int16 once and serve M multiply-adds of pairs (AVX2 vpmaddwd: 16 products per
 * instruction, twice the float32 FMA's 8) into one 8-wide integer accumulator per row of x
 * (the pair x16[m, 2t], x16[m, 2t+1] broadcast). Fewer rows take several panels of a group
 * at a time: with AVX2's 16 registers all four at M ≤ 2 (each line read once), two or one
 * at more rows (the line then read again from the cache, a group being 24-96 KB at GPT-2's
 * widths); with AVX-512VL's 32 all four up to M = 6 and two at 7 and 8 (GPT-2 small's int8
 * products at M = 8: 8.8 ms against 14.3 on 16 registers).
 * Where the CPU has AVX512-VNNI, the AVX-512VL kernels add each pair sum with vpdpwssd (one
 * instruction for vpmaddwd + vpaddd, the same exact int32 sums). AMX tiles are not used
 * (no CPU with them to test on).
 * The AVX2 kernel is chosen at run time (__builtin_cpu_supports); a portable loop computes
 * the same integer sums otherwise.
 *
 * Threads: whole groups are split over PyTorch's own OpenMP threads (_parallel.h).
 * The GIL is released during the call.
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

#define MAX_ROWS 8    /* rows of x per call (decoding batch) */
#define MAX_THREADS 256
#define BLOCK 256     /* input pairs per 32-bit sum: 256 · 2 · 32767 · 127 < 2^31 */

typedef struct {
    const int32_t *x; /* x16 in pairs, transposed: [n2, M], low half input 2t, high 2t+1 */
    const float *r;   /* [M]: x ≈ r[m] x16[m] */
    const int8_t *q;  /* panels [ceil(d_out / 8), n2, 8, 2] */
    const float *s;
    const float *b; /* or NULL */
    float *y;
    Py_ssize_t M, n2, d_out; /* n2 = ceil(d_in / 2) */
} Job;

/* y[m, j] for the exact sum acc[m] (j < d_out) */
static inline float finish(const Job *J, Py_ssize_t m, Py_ssize_t j, float acc) {
    return acc * J->r[m] * J->s[j] + (J->b ? J->b[j] : 0.0f);
}

typedef void (*Kernel)(const Job *, Py_ssize_t j0, Py_ssize_t j1);

/* ---- x to 16-bit integers ---------------------------------------------------------- */

/* Row m of x (d_in entries) → xp[t * M + m] (x16 in pairs, see Job) and r[m], x ≈ r x16:
 * x16 = round(x / r), r = max |x| / 32767 (0 for a row of zeros, NaN for a row with a
 * non-finite entry, whose x16 are then 0). In double, so that no tiny row overflows 1 / r. */
static void quantize_row(const float *row, Py_ssize_t d_in, Py_ssize_t M, Py_ssize_t m,
                         int32_t *xp, float *r) {
    double amax = 0.0;
    int finite = 1;
    for (Py_ssize_t i = 0; i < d_in; i++) {
        double a = fabs((double)row[i]);
        finite &= isfinite(a);
        amax = a > amax ? a : amax;
    }
    double inv = finite && amax > 0.0 ? 32767.0 / amax : 0.0;
    r[m] = !finite ? NAN : (float)(amax / 32767.0);
    for (Py_ssize_t t = 0; t < (d_in + 1) / 2; t++) {
        long lo = finite ? lrint(row[2 * t] * inv) : 0;
        long hi = finite && 2 * t + 1 < d_in ? lrint(row[2 * t + 1] * inv) : 0;
        xp[t * M + m] = (int32_t)((uint32_t)(uint16_t)lo | ((uint32_t)(uint16_t)hi << 16));
    }
}

/* ---- portable kernel ---------------------------------------------------------------- */

#define LINE 64 /* bytes of a group at one pair of inputs */

/* Panel p's 16 weights at the first pair of inputs (the next pair LINE bytes on). */
static inline const int8_t *panel(const Job *J, Py_ssize_t p) {
    return J->q + (p / 4) * J->n2 * LINE + (p % 4) * 16;
}

static void rows_scalar(const Job *J, Py_ssize_t p0, Py_ssize_t p1) { /* panels p0 .. p1-1 */
    const Py_ssize_t n2 = J->n2, M = J->M;
    for (Py_ssize_t j = p0 * 8; j < p1 * 8 && j < J->d_out; j++) {
        const int8_t *w = panel(J, j / 8) + 2 * (j % 8);
        for (Py_ssize_t m = 0; m < M; m++) {
            float acc = 0.0f;
            for (Py_ssize_t t0 = 0; t0 < n2; t0 += BLOCK) {
                int32_t sum = 0;
                for (Py_ssize_t t = t0; t < t0 + BLOCK && t < n2; t++) {
                    uint32_t pair = (uint32_t)J->x[t * M + m];
                    sum += (int16_t)(pair & 0xffff) * w[LINE * t];
                    sum += (int16_t)(pair >> 16) * w[LINE * t + 1];
                }
                acc += (float)sum;
            }
            J->y[m * J->d_out + j] = finish(J, m, j, acc);
        }
    }
}

/* ---- AVX2 kernel ---------------------------------------------------------------------- */
#if HAVE_X86
#define TARGET __attribute__((target("avx2")))

/* y[m, 8p .. 8p+7] from the panel's float32 sums, the last panel cut at d_out */
TARGET static inline void store(const Job *J, Py_ssize_t p, Py_ssize_t m, const float *acc) {
    const Py_ssize_t j = 8 * p;
    float *y = J->y + m * J->d_out + j;
    if (j + 8 <= J->d_out) {
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(acc), _mm256_set1_ps(J->r[m])),
                                 _mm256_loadu_ps(J->s + j));
        _mm256_storeu_ps(y, J->b ? _mm256_add_ps(v, _mm256_loadu_ps(J->b + j)) : v);
        return;
    }
    for (Py_ssize_t c = 0; j + c < J->d_out; c++) y[c] = finish(J, m, j + c, acc[c]);
}

/* P panels (p .. p+P-1, one group's: p % 4 + P ≤ 4) against all M rows of x: P·M 8-wide
 * 32-bit accumulators in registers (the loops over P and M have constant bounds and unroll),
 * emptied every BLOCK pairs into float32 sums in memory. */
#define PANELS_AS(NAME, ATTR, REG, M, P) PANELS_WITH(NAME, ATTR, REG, M, P, MADD)
#define PANELS_WITH(NAME, ATTR, REG, M, P, ACC)                                                \
    ATTR static void NAME##_##M##_##P(const Job *J, Py_ssize_t p) {                           \
        const Py_ssize_t n2 = J->n2;                                                          \
        const int32_t *x = J->x;                                                              \
        const int8_t *q = panel(J, p);                                                        \
        float sums[P][M][8] = {{{0}}};                                                        \
        for (Py_ssize_t t0 = 0; t0 < n2; t0 += BLOCK) {                                       \
            const Py_ssize_t t1 = t0 + BLOCK < n2 ? t0 + BLOCK : n2;                          \
            __m256i acc[P][M];                                                                \
            _Pragma("GCC unroll 8") for (int r = 0; r < P; r++)                               \
            _Pragma("GCC unroll 8") for (int m = 0; m < M; m++)                               \
                acc[r][m] = _mm256_setzero_si256();                                           \
            Py_ssize_t t = t0;                                                                \
            for (; t + 4 <= t1; t += 4) { /* four lines of the group per turn */             \
                _Pragma("GCC unroll 4") for (Py_ssize_t u = t; u < t + 4; u++) {              \
                    _mm_prefetch((const char *)(q + LINE * (u + 32)), _MM_HINT_T0);           \
                    STEP(M, P, u, REG, ACC);                                                  \
                }                                                                             \
            }                                                                                 \
            for (; t < t1; t++) STEP(M, P, t, REG, ACC);                                      \
            _Pragma("GCC unroll 8") for (int r = 0; r < P; r++)                               \
            _Pragma("GCC unroll 8") for (int m = 0; m < M; m++)                               \
                _mm256_storeu_ps(sums[r][m], _mm256_add_ps(_mm256_loadu_ps(sums[r][m]),       \
                                                           _mm256_cvtepi32_ps(acc[r][m])));   \
        }                                                                                     \
        for (int r = 0; r < P; r++)                                                           \
            for (int m = 0; m < M; m++) store(J, p + r, m, sums[r][m]);                       \
    }
#define STEP(M, P, u, REG, ACC)                                                               \
    do {                                                                                      \
        __m256i w[P];                                                                         \
        _Pragma("GCC unroll 8") for (int r = 0; r < P; r++) w[r] = _mm256_cvtepi8_epi16(      \
            _mm_loadu_si128((const __m128i *)(q + r * 16 + LINE * (u))));                     \
        _Pragma("GCC unroll 8") for (int m = 0; m < M; m++) {                                 \
            __m256i xv = _mm256_set1_epi32(x[(u) * M + m]);                                   \
            _Pragma("GCC unroll 8") for (int r = 0; r < P; r++) {                             \
                acc[r][m] = ACC(acc[r][m], w[r], xv);                                         \
                __asm__("" : REG(acc[r][m])); /* in this order: no reassociated sums */       \
            }                                                                                 \
        }                                                                                     \
    } while (0)

/* acc + Σ pairs of 16-bit products: AVX2's vpmaddwd then vpaddd, or AVX512-VNNI's vpdpwssd
 * (one instruction, the same exact int32 sums: neither saturates) */
#define MADD(acc, w, x) _mm256_add_epi32((acc), _mm256_madd_epi16((w), (x)))
#define VNNI(acc, w, x) _mm256_dpwssd_epi32((acc), (w), (x))

/* AVX2: 16 vector registers, so P·M + P + 1 ≤ 16 ("+x": one of them) */
#define PANELS(M, P) PANELS_AS(panels, TARGET, "+x", M, P)
/* AVX-512VL: the same code on 32 registers ("+v"), four panels (a whole line) up to M = 6 and
 * two at M = 7, 8, where AVX2 reads each line in two or four passes */
#define TARGET_VL __attribute__((target("avx2,avx512f,avx512vl")))
#define PANELS_VL(M, P) PANELS_AS(panels_vl, TARGET_VL, "+v", M, P)

PANELS(1, 4)
PANELS(1, 1)
PANELS(2, 4)
PANELS(2, 1)
PANELS(3, 2)
PANELS(3, 1)
PANELS(4, 2)
PANELS(4, 1)
PANELS(5, 2)
PANELS(5, 1)
PANELS(6, 2)
PANELS(6, 1)
PANELS(7, 1)
PANELS(8, 1)
PANELS_VL(3, 4)
PANELS_VL(4, 4)
PANELS_VL(5, 4)
PANELS_VL(6, 4)
PANELS_VL(7, 2)
PANELS_VL(8, 2)
/* AVX512-VNNI (with VL): the AVX-512VL kernels with vpdpwssd */
#define TARGET_VNNI __attribute__((target("avx2,avx512f,avx512vl,avx512vnni")))
#define PANELS_VNNI(M, P) PANELS_WITH(panels_vnni, TARGET_VNNI, "+v", M, P, VNNI)
PANELS_VNNI(1, 4)
PANELS_VNNI(2, 4)
PANELS_VNNI(3, 4)
PANELS_VNNI(4, 4)
PANELS_VNNI(5, 4)
PANELS_VNNI(6, 4)
PANELS_VNNI(7, 2)
PANELS_VNNI(8, 2)
PANELS_VNNI(1, 1)
PANELS_VNNI(2, 1)
PANELS_VNNI(3, 1)
PANELS_VNNI(4, 1)
PANELS_VNNI(5, 1)
PANELS_VNNI(6, 1)
PANELS_VNNI(7, 1)
PANELS_VNNI(8, 1)

static int use_vl;   /* the CPU has AVX-512F and VL: the wide kernels on 32 registers */
static int use_vnni; /* ... and AVX512-VNNI: those kernels with vpdpwssd */

/* quantize_row with 8 entries at a time (float32 1 / r: the same x16 up to a tie in the
 * rounding); rows whose largest |x| is tiny (1 / r near float32's range) or not finite, and
 * the last d_in mod 8 entries, go through quantize_row's arithmetic. */
TARGET static void quantize_row_avx2(const float *row, Py_ssize_t d_in, Py_ssize_t M,
                                     Py_ssize_t m, int32_t *xp, float *r) {
    const Py_ssize_t n8 = d_in & ~(Py_ssize_t)7;
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(3.0e38f);
    __m256 amax = _mm256_setzero_ps(), ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (Py_ssize_t i = 0; i < n8; i += 8) {
        __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(row + i));
        ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, big, _CMP_LE_OQ)); /* false for inf, NaN */
        amax = _mm256_max_ps(amax, a);
    }
    float lanes[8], top = 0.0f;
    _mm256_storeu_ps(lanes, amax);
    for (int c = 0; c < 8; c++) top = lanes[c] > top ? lanes[c] : top;
    for (Py_ssize_t i = n8; i < d_in; i++) top = fabsf(row[i]) > top ? fabsf(row[i]) : top;
    if (_mm256_movemask_ps(ok) != 0xff || !(top >= 1e-30f && top <= 3.0e38f)) {
        quantize_row(row, d_in, M, m, xp, r); /* tiny, zero or non-finite */
        return;
    }
    const float inv = (float)(32767.0 / top);
    r[m] = (float)(top / 32767.0);
    const __m256 vinv = _mm256_set1_ps(inv);
    for (Py_ssize_t i = 0; i < n8; i += 8) {
        __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + i), vinv));
        __m128i h = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        int32_t pairs[4];
        _mm_storeu_si128((__m128i *)pairs, h); /* x16 of inputs i .. i+7, two per word */
        for (int k = 0; k < 4; k++) xp[(i / 2 + k) * M + m] = pairs[k];
    }
    for (Py_ssize_t t = n8 / 2; t < (d_in + 1) / 2; t++) {
        long lo = lrintf(row[2 * t] * inv);
        long hi = 2 * t + 1 < d_in ? lrintf(row[2 * t + 1] * inv) : 0;
        xp[t * M + m] = (int32_t)((uint32_t)(uint16_t)lo | ((uint32_t)(uint16_t)hi << 16));
    }
}

typedef void (*PanelFn)(const Job *, Py_ssize_t);

/* panels p0 .. p1-1: `wide` panels at a time (4, 2 or 1 by M), then one at a time */
TARGET static void rows_avx2(const Job *J, Py_ssize_t p0, Py_ssize_t p1) {
    static const PanelFn wide[MAX_ROWS + 1] = {NULL, panels_1_4, panels_2_4, panels_3_2,
                                               panels_4_2, panels_5_2, panels_6_2, panels_7_1,
                                               panels_8_1};
    static const PanelFn one[MAX_ROWS + 1] = {NULL, panels_1_1, panels_2_1, panels_3_1,
                                              panels_4_1, panels_5_1, panels_6_1, panels_7_1,
                                              panels_8_1};
    static const int width[MAX_ROWS + 1] = {0, 4, 4, 2, 2, 2, 2, 1, 1};
    static const PanelFn wide_vl[MAX_ROWS + 1] = {NULL, panels_1_4, panels_2_4, panels_vl_3_4,
                                                  panels_vl_4_4, panels_vl_5_4, panels_vl_6_4,
                                                  panels_vl_7_2, panels_vl_8_2};
    static const int width_vl[MAX_ROWS + 1] = {0, 4, 4, 4, 4, 4, 4, 2, 2};
    static const PanelFn wide_vnni[MAX_ROWS + 1] = {
        NULL, panels_vnni_1_4, panels_vnni_2_4, panels_vnni_3_4, panels_vnni_4_4,
        panels_vnni_5_4, panels_vnni_6_4, panels_vnni_7_2, panels_vnni_8_2};
    static const PanelFn one_vnni[MAX_ROWS + 1] = {
        NULL, panels_vnni_1_1, panels_vnni_2_1, panels_vnni_3_1, panels_vnni_4_1,
        panels_vnni_5_1, panels_vnni_6_1, panels_vnni_7_1, panels_vnni_8_1};
    const int P = (use_vl ? width_vl : width)[J->M];
    const PanelFn many = (use_vnni ? wide_vnni : use_vl ? wide_vl : wide)[J->M];
    const PanelFn single = (use_vnni ? one_vnni : one)[J->M];
    Py_ssize_t p = p0;
    for (; p + P <= p1; p += P) many(J, p);
    for (; p < p1; p++) single(J, p);
}
#endif

static Kernel pick_kernel(const char **name) {
#if HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        use_vl = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
        use_vnni = use_vl && __builtin_cpu_supports("avx512vnni");
        *name = use_vnni ? "avx512vnni" : use_vl ? "avx2+avx512vl" : "avx2";
        return rows_avx2;
    }
#endif
    *name = "scalar";
    return rows_scalar;
}

static Kernel KERNEL;
static const char *KERNEL_NAME;

/* ---- the threads ------------------------------------------------------------------ */

static void part(const void *job, int k, int parts) { /* panels of part k: whole groups */
    const Job *J = job;
    int p0, p1;
    share((int)((J->d_out + 7) / 8), 4, k, parts, &p0, &p1);
    if (p0 < p1) KERNEL(J, p0, p1);
}

static void run(const Job *J, int threads) {
    /* a part per thread, but none smaller than 64 KiB of weights (not worth a wake-up) */
    Py_ssize_t max_parts = J->d_out * J->n2 / 32768;
    if (threads > max_parts) threads = max_parts > 1 ? (int)max_parts : 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    run_parts(part, J, threads);
}

/* ---- Python ------------------------------------------------------------------------- */

/* The slots: x, q, s, b, y, M, d_in, d_out, threads. */
static int gemv_impl(const long long *a, const double *unused, KernelError *err) {
    const Py_ssize_t M = (Py_ssize_t)a[5], d_in = (Py_ssize_t)a[6], d_out = (Py_ssize_t)a[7];
    if (M < 1 || M > MAX_ROWS || d_in < 0 || d_out < 0 || !a[0] || !a[1] || !a[2] || !a[4])
        return kernel_fail(err, KERR_VALUE,
                           "gemv: need 1 ≤ M ≤ 8, sizes ≥ 0 and non-null buffers");
    const Py_ssize_t n2 = (d_in + 1) / 2;
    int32_t *xp = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(n2 > 0 ? M * n2 : 1));
    float r[MAX_ROWS];
    if (!xp) return kernel_fail(err, KERR_MEMORY, "out of memory");
    for (Py_ssize_t m = 0; m < M; m++) {
        const float *row = (const float *)(uintptr_t)a[0] + m * d_in;
#if HAVE_X86
        if (KERNEL == rows_avx2) {
            quantize_row_avx2(row, d_in, M, m, xp, r);
            continue;
        }
#endif
        quantize_row(row, d_in, M, m, xp, r);
    }
    Job J = {xp, r, (const int8_t *)(uintptr_t)a[1], (const float *)(uintptr_t)a[2],
             (const float *)(uintptr_t)a[3], (float *)(uintptr_t)a[4], M, n2, d_out};
    run(&J, (int)a[8]);
    PyMem_RawFree(xp);
    return 0;
}

static const KernelEntry GEMV = {"gemv", "iiiiiiiii", gemv_impl, 1,
                                 "gemv(x, p, s, b, y, M, d_in, d_out, threads)"};

/* The Python arguments parsed as before (PyArg_ParseTuple's types), then into GEMV's slots. */
static PyObject *gemv(PyObject *self, PyObject *args) {
    unsigned long long x, q, s, b, y;
    Py_ssize_t M, d_in, d_out;
    int threads;
    if (!PyArg_ParseTuple(args, "KKKKKnnni", &x, &q, &s, &b, &y, &M, &d_in, &d_out, &threads))
        return NULL;
    const long long a[9] = {(long long)x, (long long)q, (long long)s, (long long)b, (long long)y,
                            M, d_in, d_out, threads};
    return run_slots(&GEMV, a, NULL);
}

static const KernelEntry *const IMPLS[] = {&GEMV, NULL};

static PyObject *use_portable(PyObject *self, PyObject *flag) { /* tests: the portable loop */
    int on = PyObject_IsTrue(flag);
    if (on < 0) return NULL;
    if (on) KERNEL = rows_scalar, KERNEL_NAME = "scalar"; /* tests only: no call may be in flight */
    else KERNEL = pick_kernel(&KERNEL_NAME);
    return PyUnicode_FromString(KERNEL_NAME);
}

static PyObject *wide_registers(PyObject *self, PyObject *flag) { /* tests: the AVX2 kernels */
    int on = PyObject_IsTrue(flag);
    if (on < 0) return NULL;
    KERNEL = pick_kernel(&KERNEL_NAME); /* tests only: no call may be in flight */
#if HAVE_X86
    if (!on && use_vl) use_vl = use_vnni = 0, KERNEL_NAME = "avx2";
#else
    (void)on; /* no wide registers to turn off: the portable loop */
#endif
    return PyUnicode_FromString(KERNEL_NAME);
}

static PyObject *vnni(PyObject *self, PyObject *flag) { /* tests: the AVX-512VL kernels */
    int on = PyObject_IsTrue(flag);
    if (on < 0) return NULL;
    KERNEL = pick_kernel(&KERNEL_NAME); /* tests only: no call may be in flight */
#if HAVE_X86
    if (!on && use_vnni) use_vnni = 0, KERNEL_NAME = "avx2+avx512vl";
#else
    (void)on;
#endif
    return PyUnicode_FromString(KERNEL_NAME);
}

static PyObject *kernel_name(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(KERNEL_NAME);
}

static PyMethodDef methods[] = {
    {"gemv", gemv, METH_VARARGS,
     "gemv(x, p, s, b, y, M, d_in, d_out, threads): y = (x qᵀ)·s + b, q in groups p [d_out/32 "
     "(rounded up), d_in/2 (rounded up), 32, 2]; addresses as ints, b 0 for none (the GIL is "
     "released)"},
    {"kernel", kernel_name, METH_NOARGS,
     "the kernel in use: 'avx512vnni', 'avx2+avx512vl', 'avx2' or 'scalar'"},
    {"use_portable", use_portable, METH_O, "use_portable(flag): force the portable loop (tests)"},
    {"wide_registers", wide_registers, METH_O,
     "wide_registers(flag): the AVX-512VL kernels where the CPU has them (True), or the AVX2 "
     "ones (tests); returns the kernel now in use"},
    {"vnni", vnni, METH_O,
     "vnni(flag): the AVX512-VNNI kernels where the CPU has them (True), or the AVX-512VL "
     "ones (tests); returns the kernel now in use"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_int8",
                                    "The int8 weight-only product for a few rows.", -1, methods};

PyMODINIT_FUNC PyInit__int8(void) {
    KERNEL = pick_kernel(&KERNEL_NAME);
    return export_impls(PyModule_Create(&module), IMPLS);
}
