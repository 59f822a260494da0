/* The GELUs of glassgpt's _rowwise extension, float32, and their slopes:
 *
 *   tanh GELU    y = ½ x (1 + tanh(u)) = x σ(2u),   u = √(2/π) (x + 0.044715 x³)
 *   its slope    dy/dx = s + x s (1 − s) c₀ (1 + 3 c₁ x²),   s = σ(2u), c₀ = 2√(2/π), c₁ = 0.044715
 *   exact GELU   y = x Φ(x),  Φ(x) = ½ (1 + erf(x/√2));  slope Φ(x) + x φ(x), φ the normal density
 *
 *   gelu_many(x, g or 0, y, n, threads, exact)   the GELU, tanh or exact (erf), or its
 *                              gradient (g ≠ 0), over n values, in parts (a decoding step's
 *                              few rows: threads = 1), the GIL released
 *   gelu_slope(x, y, d, n, threads)   the tanh GELU y (gelu_many's bits) and its slope d in
 *                              one pass, in parts: a training step's forward keeps d, and its
 *                              backward is one product g · d instead of the exps again
 *
 * With AVX2 + FMA the tanh GELU is x / (1 + exp(−2u)) with exp8 (_vexp.h; a few float32 ulps
 * from PyTorch's tanh form), the portable loop the tanh form itself; picked by pick_gelu.
 * Include once, from _rowwise.c (after _cpu.h, _parallel.h, _vexp.h and _module.h).
 */
#ifndef GLASSGPT_GELU_H
#define GLASSGPT_GELU_H

typedef void (*GeluFn)(const float *x, float *y, Py_ssize_t n);
typedef void (*GeluBackFn)(const float *x, const float *g, float *dx, Py_ssize_t n);
typedef void (*GeluSlopeFn)(const float *x, float *y, float *d, Py_ssize_t n);

#define GELU_C0 0.7978845608028654f /* √(2/π) */
#define GELU_C1 0.044715f
#define SQRT_HALF 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f

static void gelu_portable(const float *x, float *y, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const float u = GELU_C0 * (x[i] + GELU_C1 * x[i] * x[i] * x[i]);
        y[i] = 0.5f * x[i] * (1.0f + tanhf(u));
    }
}

/* The tanh GELU's slope s + v s (1 − s) c₀ (1 + 3 c₁ v²), s = σ(c₀ (v + c₁ v³)), c₀ = 2√(2/π):
 * the derivative of v s, which is the tanh GELU (½ (1 + tanh u) = σ(2u)). */
static inline float gelu_slope1(float v) {
    const float c0 = 2.0f * GELU_C0, s = 1.0f / (1.0f + expf(-c0 * (v + GELU_C1 * v * v * v)));
    return s + v * s * (1.0f - s) * c0 * (1.0f + 3.0f * GELU_C1 * v * v);
}

/* dx = g · GELU'(x). */
static void gelu_backward_portable(const float *x, const float *g, float *dx, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        dx[i] = g[i] * gelu_slope1(x[i]);
}

/* The tanh GELU y, as gelu_portable computes it (the same bits), and its slope d, in one
 * pass: for a training step's forward to keep d, so that its backward is g · d. */
static void gelu_slope_portable(const float *x, float *y, float *d, Py_ssize_t n) {
    gelu_portable(x, y, n);
    for (Py_ssize_t i = 0; i < n; i++)
        d[i] = gelu_slope1(x[i]);
}

/* The exact GELU, y = x Φ(x) with Φ(x) = ½ (1 + erf(x/√2)), and its slope Φ(x) + x φ(x),
 * φ(x) = exp(−x²/2)/√(2π). */
static void gelu_erf_portable(const float *x, float *y, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * SQRT_HALF));
}

static void gelu_erf_backward_portable(const float *x, const float *g, float *dx, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const float v = x[i], cdf = 0.5f * (1.0f + erff(v * SQRT_HALF));
        dx[i] = g[i] * (cdf + v * expf(-0.5f * v * v) * INV_SQRT_2PI);
    }
}

#if GG_X86
AVX2 static void gelu_avx2(const float *x, float *y, Py_ssize_t n) {
    const __m256 c0 = _mm256_set1_ps(-2.0f * GELU_C0);  /* −2u = x (c0 + c1 x²) */
    const __m256 c1 = _mm256_set1_ps(-2.0f * GELU_C0 * GELU_C1);
    const __m256 one = _mm256_set1_ps(1.0f);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 t = _mm256_mul_ps(v, _mm256_fmadd_ps(c1, _mm256_mul_ps(v, v), c0));
        _mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(one, exp8(t))));
    }
    gelu_portable(x + i, y + i, n - i);
}

/* The tanh GELU's slope d = s + x s (1 − s) c₀ (1 + 3 c₁ x²) for 8 lanes v, and the
 * denominator 1 + exp(−2u) (s = 1 / den), which gelu_avx2 divides x by. */
AVX2 static inline __m256 gelu_slope8(__m256 v, __m256 *den) {
    const __m256 nc0 = _mm256_set1_ps(-2.0f * GELU_C0), nc1 = _mm256_set1_ps(-2.0f * GELU_C0 * GELU_C1);
    const __m256 c0 = _mm256_set1_ps(2.0f * GELU_C0), c3 = _mm256_set1_ps(3.0f * GELU_C1);
    const __m256 one = _mm256_set1_ps(1.0f), v2 = _mm256_mul_ps(v, v);
    *den = _mm256_add_ps(one, exp8(_mm256_mul_ps(v, _mm256_fmadd_ps(nc1, v2, nc0))));
    __m256 s = _mm256_div_ps(one, *den);
    __m256 slope = _mm256_mul_ps(_mm256_mul_ps(v, s), _mm256_sub_ps(one, s)); /* x s (1 − s) */
    slope = _mm256_mul_ps(slope, _mm256_mul_ps(c0, _mm256_fmadd_ps(c3, v2, one)));
    return _mm256_add_ps(s, slope);
}

AVX2 static void gelu_backward_avx2(const float *x, const float *g, float *dx, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 den, d = gelu_slope8(_mm256_loadu_ps(x + i), &den);
        _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), d));
    }
    gelu_backward_portable(x + i, g + i, dx + i, n - i);
}

/* gelu_slope_portable with exp8: y as gelu_avx2 gives it, bit for bit, and its slope. */
AVX2 static void gelu_slope_avx2(const float *x, float *y, float *d, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), den;
        _mm256_storeu_ps(d + i, gelu_slope8(v, &den));
        _mm256_storeu_ps(y + i, _mm256_div_ps(v, den));
    }
    gelu_slope_portable(x + i, y + i, d + i, n - i);
}

/* Φ(x) and exp(−x²/2) for 8 lanes: erfc(z) = t (a₁ + t (a₂ + t (a₃ + t (a₄ + t a₅)))) e^{−z²},
 * t = 1/(1 + p z), z = |x|/√2 (Abramowitz and Stegun 7.1.26: |error| < 1.5e-7), and
 * Φ(x) = 1 − ½ erfc(z) for x ≥ 0, ½ erfc(z) below: no cancellation in the left tail. */
AVX2 static inline __m256 normal_cdf8(__m256 v, __m256 *gauss) {
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    __m256 z = _mm256_mul_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), _mm256_set1_ps(SQRT_HALF));
    __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), z, one));
    __m256 p = _mm256_set1_ps(1.061405429f);
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
    p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
    *gauss = exp8(_mm256_mul_ps(_mm256_set1_ps(-1.0f), _mm256_mul_ps(z, z))); /* e^{−x²/2} */
    __m256 tail = _mm256_mul_ps(half, _mm256_mul_ps(_mm256_mul_ps(p, t), *gauss)); /* ½ erfc(z) */
    __m256 right = _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GE_OQ);
    return _mm256_blendv_ps(tail, _mm256_sub_ps(one, tail), right);
}

AVX2 static void gelu_erf_avx2(const float *x, float *y, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), gauss;
        _mm256_storeu_ps(y + i, _mm256_mul_ps(v, normal_cdf8(v, &gauss)));
    }
    gelu_erf_portable(x + i, y + i, n - i);
}

AVX2 static void gelu_erf_backward_avx2(const float *x, const float *g, float *dx, Py_ssize_t n) {
    const __m256 c = _mm256_set1_ps(INV_SQRT_2PI);
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), gauss;
        __m256 cdf = normal_cdf8(v, &gauss);
        __m256 slope = _mm256_fmadd_ps(_mm256_mul_ps(v, c), gauss, cdf); /* Φ + x φ */
        _mm256_storeu_ps(dx + i, _mm256_mul_ps(_mm256_loadu_ps(g + i), slope));
    }
    gelu_erf_backward_portable(x + i, g + i, dx + i, n - i);
}
#endif

static GeluFn GELU = gelu_portable;
static GeluBackFn GELU_BACK = gelu_backward_portable;
static GeluFn GELU_ERF = gelu_erf_portable;
static GeluBackFn GELU_ERF_BACK = gelu_erf_backward_portable;
static GeluSlopeFn GELU_SLOPE = gelu_slope_portable;

static void pick_gelu(int avx2) {
    GELU = gelu_portable, GELU_BACK = gelu_backward_portable, GELU_SLOPE = gelu_slope_portable;
    GELU_ERF = gelu_erf_portable, GELU_ERF_BACK = gelu_erf_backward_portable;
#if GG_X86
    if (avx2) {
        GELU = gelu_avx2, GELU_BACK = gelu_backward_avx2, GELU_SLOPE = gelu_slope_avx2;
        GELU_ERF = gelu_erf_avx2, GELU_ERF_BACK = gelu_erf_backward_avx2;
    }
#endif
}

/* A training step's GELU: n values (n can be millions), forward or backward, in parts on
 * PyTorch's threads (_parallel.h); each part a contiguous range of whole 8-value groups. */
typedef struct {
    const float *x, *g; /* g: the incoming gradient (backward), NULL forward */
    float *y;
    Py_ssize_t n;
    int exact; /* the exact (erf) GELU, else the tanh one */
    float *d;  /* the tanh GELU's slope, kept with y (forward; NULL: not kept) */
} Elementwise;

#define GELU_PART_MIN 32768 /* values per part at least: a thread's wake-up costs ~10 µs */

static void gelu_part(const void *job, int part, int parts) {
    const Elementwise *e = job;
    const Py_ssize_t groups = (e->n + 7) / 8;
    Py_ssize_t lo = groups * part / parts * 8, hi = groups * (part + 1) / parts * 8;
    hi = hi < e->n ? hi : e->n;
    if (lo >= hi)
        return;
    if (e->d)
        GELU_SLOPE(e->x + lo, e->y + lo, e->d + lo, hi - lo);
    else if (e->g)
        (e->exact ? GELU_ERF_BACK : GELU_BACK)(e->x + lo, e->g + lo, e->y + lo, hi - lo);
    else
        (e->exact ? GELU_ERF : GELU)(e->x + lo, e->y + lo, hi - lo);
}

/* e over its n values in parts of GELU_PART_MIN values at least, on up to `threads` threads,
 * the GIL released. */
static void run_elementwise_parts(const Elementwise *e, long long threads) {
    long long parts = threads < 1 ? 1 : threads;
    if (parts > e->n / GELU_PART_MIN)
        parts = e->n / GELU_PART_MIN > 0 ? e->n / GELU_PART_MIN : 1;
    if (parts > 256)
        parts = 256;
    run_parts(gelu_part, e, (int)parts);
}

static void run_elementwise(const Elementwise *e, long long threads) {
    Py_BEGIN_ALLOW_THREADS
    run_elementwise_parts(e, threads);
    Py_END_ALLOW_THREADS
}

/* gelu_many(x, g or 0, y, n, threads, exact): y = GELU(x) (g = 0) or y = g · GELU'(x), the
 * exact GELU (exact ≠ 0) or the tanh one. */
static int gelu_many_impl(const long long *a, const double *unused, KernelError *err) {
    if (a[3] < 0)
        return kernel_fail(err, KERR_VALUE, "gelu_many: need n >= 0; got %lld", a[3]);
    Elementwise e = {(const float *)(uintptr_t)a[0], (const float *)(uintptr_t)a[1],
                     (float *)(uintptr_t)a[2], (Py_ssize_t)a[3], a[5] != 0, NULL};
    run_elementwise_parts(&e, a[4]);
    return 0;
}

/* (the GIL released through the run) */
static const KernelEntry GELU_MANY = {"gelu_many", "iiiiii", gelu_many_impl, 1,
                                      "gelu_many(x, g, y, n, threads, exact)"};

FASTCALL_ENTRY(gelu_many, GELU_MANY)

/* gelu_slope(x, y, d, n, threads): y = GELU(x) and d = GELU'(x), the tanh GELU, in one pass. */
static PyObject *gelu_slope(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long a[5];
    if (!int_args(args, nargs, 5, a, "gelu_slope(x, y, d, n, threads)"))
        return NULL;
    if (a[3] < 0) {
        PyErr_Format(PyExc_ValueError, "gelu_slope: need n >= 0; got %lld", a[3]);
        return NULL;
    }
    Elementwise e = {(const float *)(uintptr_t)a[0], NULL, (float *)(uintptr_t)a[1],
                     (Py_ssize_t)a[3], 0, (float *)(uintptr_t)a[2]};
    run_elementwise(&e, a[4]);
    Py_RETURN_NONE;
}

#endif
