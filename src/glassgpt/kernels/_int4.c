/* The int4 weight-only product of glassgpt.kernels.int4, for a few rows of x (decoding).
 *
 *     y[m, j] = Σ_g d[j, g] · Σ_{i in group g} x[m, i] q[j, i] + b[j]
 *
 * q ∈ [−8, 7] in groups of 32 inputs, one float16 scale d[j, g] per group: W̃[i, j] = q d.
 * x float32 [M, d_in], b float32 [d_out] or none, y float32 [M, d_out]. The weights are
 * laid out in blocks of 16 output channels (a panel) by 32 inputs (a group), one block of
 * 288 bytes: 16 input pairs × 16 channels of one byte, u[j, 2t] | u[j, 2t+1] << 4 with
 * u = q + 8, then the block's 16 float16 scales. A panel's blocks follow each other, so a
 * thread streams its panels front to back (4.5 bits a weight).
 *
 * Arithmetic in float32, from the dequantized weights themselves: a nibble becomes its float
 * value q (exactly), each group's sum Σ x q is taken in float32 and scaled by d once. So the
 * result is x W̃ + b up to float32 rounding (no rounding of x, unlike _int8.c), which the
 * tests check against float64. At one row the product is bound by reading the weights, at
 * 4.5 bits a weight 7.1× fewer bytes than float32.
 *
 * Kernels, chosen at run time (__builtin_cpu_supports), each forced in turn by the tests:
 * - avx512: 16 channels a vector; a nibble becomes a float by one vpermps from a 16-entry
 *   table (the index's low 4 bits) and meets x in one FMA; M ≤ 8 rows share each decode.
 * - avx2: 8 channels a vector (two per panel); and/shift, subtract 8, convert, FMA.
 * - scalar: the portable loop.
 * Threads: whole panels split over PyTorch's own OpenMP threads (_parallel.h); GIL released.
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

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

typedef struct {
    const float *x; /* [M, G * 32], zero past d_in */
    const uint8_t *w; /* [P, G, 288] */
    const float *b;   /* or NULL */
    float *y;
    Py_ssize_t M, G, d_out;
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

/* ---- portable kernel ---------------------------------------------------------------- */

static void rows_scalar(const Job *J, Py_ssize_t p0, Py_ssize_t p1) {
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
                    for (int t = 0; t < GROUP / 2; t++) {
                        uint8_t u = blk[t * PANEL + c];
                        acc += x[g * GROUP + 2 * t] * (float)((int)(u & 15) - 8);
                        acc += x[g * GROUP + 2 * t + 1] * (float)((int)(u >> 4) - 8);
                    }
                    y[c] += acc * half_to_float(d[c]);
                }
            }
            store(J, p, m, y);
        }
}

#if HAVE_X86
/* ---- AVX2 kernel: 8 channels a vector, rows in twos ----------------------------------- */
#define T2 __attribute__((target("avx2,fma,f16c")))

/* four sums a row (two halves × lo/hi nibbles): independent FMA chains */
T2 static void rows_avx2(const Job *J, Py_ssize_t p0, Py_ssize_t p1) {
    const Py_ssize_t G = J->G, W = G * GROUP, M = J->M;
    const __m256i low = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
    for (Py_ssize_t p = p0; p < p1; p++)
        for (Py_ssize_t m0 = 0; m0 < M; m0 += 2) {
            const int R = M - m0 < 2 ? (int)(M - m0) : 2;
            float y[2][PANEL] = {{0}};
            for (Py_ssize_t g = 0; g < G; g++) {
                const uint8_t *blk = J->w + (p * G + g) * BLOCK_BYTES;
                _mm_prefetch((const char *)(blk + 4 * BLOCK_BYTES), _MM_HINT_T0);
                _mm_prefetch((const char *)(blk + 4 * BLOCK_BYTES + 64), _MM_HINT_T0);
                _mm_prefetch((const char *)(blk + 4 * BLOCK_BYTES + 128), _MM_HINT_T0);
                _mm_prefetch((const char *)(blk + 4 * BLOCK_BYTES + 192), _MM_HINT_T0);
                _mm_prefetch((const char *)(blk + 4 * BLOCK_BYTES + 256), _MM_HINT_T0);
                __m256 acc[2][4];
                for (int r = 0; r < 2; r++)
                    for (int k = 0; k < 4; k++) acc[r][k] = _mm256_setzero_ps();
                for (int t = 0; t < GROUP / 2; t++) {
                    __m128i bytes = _mm_loadu_si128((const __m128i *)(blk + t * PANEL));
                    __m256i v0 = _mm256_cvtepu8_epi32(bytes);
                    __m256i v1 = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
                    __m256 w[4] = {
                        _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v0, low), eight)),
                        _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v1, low), eight)),
                        _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v0, 4), eight)),
                        _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(v1, 4), eight))};
                    for (int r = 0; r < R; r++) {
                        const float *x = J->x + (m0 + r) * W + g * GROUP + 2 * t;
                        __m256 a = _mm256_broadcast_ss(x), c = _mm256_broadcast_ss(x + 1);
                        acc[r][0] = _mm256_fmadd_ps(w[0], a, acc[r][0]);
                        acc[r][1] = _mm256_fmadd_ps(w[1], a, acc[r][1]);
                        acc[r][2] = _mm256_fmadd_ps(w[2], c, acc[r][2]);
                        acc[r][3] = _mm256_fmadd_ps(w[3], c, acc[r][3]);
                    }
                }
                __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + NIBBLES)));
                __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + NIBBLES + 16)));
                for (int r = 0; r < R; r++) {
                    __m256 s0 = _mm256_add_ps(acc[r][0], acc[r][2]);
                    __m256 s1 = _mm256_add_ps(acc[r][1], acc[r][3]);
                    _mm256_storeu_ps(y[r], _mm256_fmadd_ps(s0, d0, _mm256_loadu_ps(y[r])));
                    _mm256_storeu_ps(y[r] + 8, _mm256_fmadd_ps(s1, d1, _mm256_loadu_ps(y[r] + 8)));
                }
            }
            for (int r = 0; r < R; r++) store(J, p, m0 + r, y[r]);
        }
}

/* ---- AVX-512 kernel: 16 channels a vector, all M rows at once --------------------------- */
#define T5 __attribute__((target("avx2,fma,f16c,avx512f")))

/* acc chains: an FMA's latency is 4 cycles, so one row needs 4 independent sums (lo/hi
 * nibbles × even/odd pairs) to keep the FMA units busy; two rows 2 each, more rows 1 pair */
/* input pair t of the block: nibbles → floats, the FMAs into accumulators ka (lo), kb (hi) */
#define PAIR512(M, t, ka, kb)                                                                 \
    do {                                                                                      \
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + (t) * PANEL))); \
        __m512 lo = _mm512_permutexvar_ps(v, table);                                          \
        __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);                    \
        _Pragma("GCC unroll 8") for (int r = 0; r < M; r++) {                                 \
            const float *x = xg + r * W + 2 * (t);                                            \
            acc[ka][r] = _mm512_fmadd_ps(lo, _mm512_set1_ps(x[0]), acc[ka][r]);               \
            acc[kb][r] = _mm512_fmadd_ps(hi, _mm512_set1_ps(x[1]), acc[kb][r]);               \
            __asm__("" : "+v"(acc[ka][r]), "+v"(acc[kb][r])); /* kept in registers */         \
        }                                                                                     \
    } while (0)

#define ROWS512(M, C)                                                                         \
    T5 static void rows512_##M(const Job *J, Py_ssize_t p0, Py_ssize_t p1) {                  \
        const Py_ssize_t G = J->G, W = G * GROUP;                                             \
        const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5,  \
                                            6, 7);                                            \
        for (Py_ssize_t p = p0; p < p1; p++) {                                                \
            __m512 y[M];                                                                      \
            _Pragma("GCC unroll 8") for (int r = 0; r < M; r++) y[r] = _mm512_setzero_ps();    \
            const uint8_t *blk = J->w + p * G * BLOCK_BYTES;                                  \
            for (Py_ssize_t g = 0; g < G; g++, blk += BLOCK_BYTES) {                          \
                _mm_prefetch((const char *)(blk + 4 * BLOCK_BYTES), _MM_HINT_T0);             \
                _mm_prefetch((const char *)(blk + 4 * BLOCK_BYTES + 64), _MM_HINT_T0);        \
                _mm_prefetch((const char *)(blk + 4 * BLOCK_BYTES + 128), _MM_HINT_T0);       \
                _mm_prefetch((const char *)(blk + 4 * BLOCK_BYTES + 192), _MM_HINT_T0);       \
                _mm_prefetch((const char *)(blk + 4 * BLOCK_BYTES + 256), _MM_HINT_T0);       \
                __m512 acc[C][M];                                                             \
                _Pragma("GCC unroll 4") for (int k = 0; k < C; k++)                           \
                _Pragma("GCC unroll 8") for (int r = 0; r < M; r++)                           \
                    acc[k][r] = _mm512_setzero_ps();                                          \
                const float *xg = J->x + g * GROUP;                                           \
                for (int t = 0; t < GROUP / 2; t += 2) { /* accumulators by constant index */ \
                    PAIR512(M, t, 0, (C > 1 ? 1 : 0));                                        \
                    PAIR512(M, t + 1, (C == 4 ? 2 : 0), (C == 4 ? 3 : C > 1 ? 1 : 0));         \
                }                                                                             \
                __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + NIBBLES))); \
                _Pragma("GCC unroll 8") for (int r = 0; r < M; r++) {                         \
                    __m512 a = acc[0][r];                                                     \
                    _Pragma("GCC unroll 4") for (int k = 1; k < C; k++)                       \
                        a = _mm512_add_ps(a, acc[k][r]);                                      \
                    y[r] = _mm512_fmadd_ps(a, d, y[r]);                                       \
                }                                                                             \
            }                                                                                 \
            for (int r = 0; r < M; r++) {                                                     \
                float out[PANEL];                                                             \
                _mm512_storeu_ps(out, y[r]);                                                  \
                store(J, p, r, out);                                                          \
            }                                                                                 \
        }                                                                                     \
    }

ROWS512(1, 4)
ROWS512(2, 2)
ROWS512(3, 2)
ROWS512(4, 2)
ROWS512(5, 1)
ROWS512(6, 1)
ROWS512(7, 1)
ROWS512(8, 1)

static void rows_avx512(const Job *J, Py_ssize_t p0, Py_ssize_t p1) {
    static const Kernel by_rows[MAX_ROWS + 1] = {NULL, rows512_1, rows512_2, rows512_3,
                                                 rows512_4, rows512_5, rows512_6, rows512_7,
                                                 rows512_8};
    by_rows[J->M](J, p0, p1);
}
#endif

static Kernel KERNEL;
static const char *KERNEL_NAME;

/* the best kernel this CPU runs, or the one named (None if the CPU lacks it) */
static Kernel pick(const char *want, const char **name) {
#if HAVE_X86
    __builtin_cpu_init();
    int has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
    int has5 = has2 && __builtin_cpu_supports("avx512f");
    if (has5 && (!want || !strcmp(want, "avx512"))) return *name = "avx512", rows_avx512;
    if (has2 && (!want || !strcmp(want, "avx2"))) return *name = "avx2", rows_avx2;
#endif
    if (!want || !strcmp(want, "scalar")) return *name = "scalar", rows_scalar;
    return NULL;
}

/* ---- the threads ------------------------------------------------------------------ */

static void part(const void *job, int k, int parts) {
    const Job *J = job;
    int p0, p1;
    share((int)((J->d_out + PANEL - 1) / PANEL), 1, k, parts, &p0, &p1);
    if (p0 < p1) KERNEL(J, p0, p1);
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

static PyObject *gemv(PyObject *self, PyObject *args) {
    unsigned long long x, w, b, y;
    Py_ssize_t M, d_in, d_out;
    int threads;
    if (!PyArg_ParseTuple(args, "KKKKnnni", &x, &w, &b, &y, &M, &d_in, &d_out, &threads))
        return NULL;
    if (M < 1 || M > MAX_ROWS || d_in < 0 || d_out < 0 || !x || !w || !y) {
        PyErr_SetString(PyExc_ValueError, "gemv: need 1 ≤ M ≤ 8, sizes ≥ 0 and non-null buffers");
        return NULL;
    }
    const Py_ssize_t G = (d_in + GROUP - 1) / GROUP, Wd = G * GROUP;
    /* x copied into rows of whole groups, zeros past d_in (the weights there are 0 too) */
    float *xp = PyMem_RawCalloc((size_t)(M * Wd > 0 ? M * Wd : 1), sizeof(float));
    if (!xp) return PyErr_NoMemory();
    for (Py_ssize_t m = 0; m < M; m++)
        memcpy(xp + m * Wd, (const float *)(uintptr_t)x + m * d_in, sizeof(float) * d_in);
    Job J = {xp, (const uint8_t *)(uintptr_t)w, (const float *)(uintptr_t)b,
             (float *)(uintptr_t)y, M, G, d_out};
    Py_BEGIN_ALLOW_THREADS run(&J, threads);
    Py_END_ALLOW_THREADS PyMem_RawFree(xp);
    Py_RETURN_NONE;
}

static PyObject *use(PyObject *self, PyObject *arg) { /* tests: force a kernel, None: best */
    const char *want = NULL, *name = NULL;
    if (arg != Py_None && !(want = PyUnicode_AsUTF8(arg))) return NULL;
    Kernel k = pick(want, &name);
    if (!k) {
        PyErr_Format(PyExc_ValueError, "this CPU has no %s kernel", want);
        return NULL;
    }
    KERNEL = k, KERNEL_NAME = name; /* tests only: no call may be in flight */
    return PyUnicode_FromString(KERNEL_NAME);
}

static PyObject *kernel_name(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(KERNEL_NAME);
}

static PyMethodDef methods[] = {
    {"gemv", gemv, METH_VARARGS,
     "gemv(x, w, b, y, M, d_in, d_out, threads): y = x W̃ + b, W̃ in blocks w [d_out/16, "
     "d_in/32 (rounded up), 288 bytes]; addresses as ints, b 0 for none (GIL released)"},
    {"quantize", quantize, METH_VARARGS,
     "quantize(W, q, d, c, n_c, d_out, G, threads): int4.quantize's groups (addresses as ints)"},
    {"kernel", kernel_name, METH_NOARGS, "the kernel in use: 'avx512', 'avx2' or 'scalar'"},
    {"use", use, METH_O, "use(name or None): force a kernel (tests); returns the one in use"},
    {NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_int4",
                                    "The int4 weight-only product for a few rows.", -1, methods};

PyMODINIT_FUNC PyInit__int4(void) {
    KERNEL = pick(NULL, &KERNEL_NAME);
    return PyModule_Create(&module);
}
