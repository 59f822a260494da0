/* Causal self-attention for training, float32, forward and backward:
 *
 *   z = P v,  P = softmax(S),  S = q kᵀ/√D + M   (M[i, j] = −∞ for j > i),  lse_i = log Σ_j e^S_ij
 *   dv = Pᵀ dz,  dP = dz vᵀ,  Δ_i = Σ_d dz_id z_id,  dS = P ∘ (dP − Δ),
 *   dq = dS k/√D,  dk = dSᵀ q/√D
 *
 * for every (b, h): q, k, v, z, dz [B, H, T, D], any strides. One (b, h) is one item, all of
 * it on one thread: its q (times 1/√D), k, v (or dz) are copied into zero-padded scratch
 * (rows of D rounded up to 8, T rounded up to 16, kᵀ and vᵀ too), small enough at the
 * shapes this serves (T ≤ 512, D ≤ 128) to stay in the core's caches. The forward takes 6
 * queries at a time: their scores against the keys up to the last of them (in 16s), the
 * softmax of each row over the keys it may see (P = 0 beyond), then z = P v; where the
 * caller gives it a buffer, it keeps P there. The backward reads that P, or recomputes
 * P = exp(S − lse), and dS for the whole lower triangle block by block (dq
 * follows each block), then dv = Pᵀ dz and dk = dSᵀ q column block by column block, each
 * product over the keys (or queries) that are not masked. The products are _tile.h's
 * 6 × 16 register tiles with AVX2 + FMA, the softmax and the other row maps _flash_rows.h's
 * (exp by _vexp.h's exp8), else their portable loops and libm's expf. Each output element
 * comes from one item in a fixed order: results do not depend on the thread count. The
 * items are split over PyTorch's own OpenMP threads (_parallel.h); the GIL is released
 * while they run. [16, 4, 128, 32] on one thread: forward 1.5 ms, backward 3.3 (PyTorch's
 * CPU flash kernel 2.9 and 7.0).
 *
 * Python API (addresses of float32 buffers as ints; strides in elements, (b, h, t, d) per
 * tensor; z, dq, dk, dv need d-stride 1, lse is a contiguous [B, H, T]; the caller checks
 * shapes and dtypes):
 *   forward(q, k, v, z, lse or 0, P or 0, B, H, T, D, strides of q, k, v, z (16), threads)
 *   backward(q, k, v, z, lse or 0, P or 0, dz, dq, dk, dv, B, H, T, D, strides of q, k, v,
 *            z, dz, dq, dk, dv (32), threads)
 * P: a contiguous [B, H, T, Tp] buffer (Tp = T rounded up to 16) for the forward to keep the
 * probabilities in, rows zero past their last key; the backward then reads them instead of
 * recomputing S and its exps (one product of five and the exps fewer; needs lse otherwise).
 *   kernel() → "avx2" or "portable";  use_portable(flag) → the kernel now in use (tests)
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_cpu.h"
#include "_parallel.h"
#include "_tile.h"
#include "_flash_rows.h"

#define MAX_THREADS 256

typedef struct {
    const float *q, *k, *v, *z, *dz; /* dz NULL: the forward */
    float *lse, *dq, *dk, *dv;       /* lse NULL: not kept (inference) */
    float *P;                        /* the forward's P [B, H, T, Tp], kept for the backward
                                        (NULL: not kept; the backward recomputes it) */
    float *out_z;
    int B, H, T, D, Tp, Dp; /* Tp, Dp: T and D padded (scratch rows) */
    long long s[8][4];      /* (b, h, t, d) strides of q, k, v, z, dz, dq, dk, dv */
    float *scratch;         /* per part: scratch_floats(Tp, Dp) */
    size_t per_part;
    float scale;
} Job;

enum { Q, K, V, Z, DZ, DQ, DK, DV };

/* ------------------------------------------------------------------ one (b, h) item -- */

static int round_up(int n, int m) { return (n + m - 1) / m * m; }
static int min_int(int a, int b) { return a < b ? a : b; }

/* Scratch floats per part: q, k, v, dz rows [Tp, Dp], kᵀ, vᵀ [Dp, Tp], P and dS
 * [Tp, Tp], Δ [Tp]; a multiple of 16 (each part on whole cache lines). */
static size_t scratch_floats(int Tp, int Dp) {
    return (size_t)Tp * (6 * (size_t)Dp + 2 * (size_t)Tp + 16);
}

/* The (b, h) slice of tensor m (its [T, D] rows). */
static const float *slice(const Job *j, const float *base, int m, int b, int h) {
    return base + b * j->s[m][0] + h * j->s[m][1];
}

/* dst[t·Dp + d] = α x[t, d], x tensor m's (b, h) slice. */
static void copy_rows(float *dst, const Job *j, const float *base, int m, int b, int h,
                      float alpha) {
    const float *x = slice(j, base, m, b, h);
    const long long st = j->s[m][2], sd = j->s[m][3];
    for (int t = 0; t < j->T; t++, dst += j->Dp) {
        const float *xt = x + t * st;
        if (sd == 1)
            COPY_ROW(dst, xt, j->D, alpha);
        else
            for (int d = 0; d < j->D; d++)
                dst[d] = alpha * xt[d * sd];
    }
}

/* Asks for rows [t0, t1) of the next item's inputs (forward: q, k, v; backward: z and dz
 * too) while this one computes: the inputs are strided slices of buffers larger than the
 * caches, and their first reads would otherwise wait on memory. */
static void prefetch_rows(const Job *j, int next, int t0, int t1) {
    if (next < 0)
        return;
    const float *bases[5] = {j->q, j->k, j->v, j->z, j->dz};
    for (int m = 0; m < (j->dz ? 5 : 3); m++) {
        const float *x = slice(j, bases[m], m, next / j->H, next % j->H);
        if (j->s[m][3] != 1)
            continue;
        for (int t = t0; t < t1; t++)
            for (int d = 0; d < j->D; d += 16)
                __builtin_prefetch(x + t * j->s[m][2] + d, 0, 2);
    }
}

static const float ONES[TILE_M] = {1, 1, 1, 1, 1, 1};

/* C[0, M) × [0, D) = diag(α) A B by tiles of TILE_N columns (B's rows readable to a
 * multiple of 8). */
static void product(int M, int Kn, const float *A, long long ar, long long ak, const float *B,
                    long long ldb, float *C, long long ldc, int D, const float *alpha) {
    for (int n0 = 0; n0 < D; n0 += TILE_N)
        TILE(M, min_int(TILE_N, D - n0), Kn, A, ar, ak, B + n0, ldb, C + n0, ldc, alpha);
}

static void forward_item(const Job *j, int b, int h, int next, float *scratch) {
    const int T = j->T, D = j->D, Tp = j->Tp, Dp = j->Dp;
    const size_t rows = (size_t)Tp * Dp;
    float *q = scratch, *k = q + rows, *v = k + rows, *kt = v + 2 * rows;
    float *S = kt + 2 * rows; /* TILE_M rows of scores, then of P */
    copy_rows(q, j, j->q, Q, b, h, j->scale);
    copy_rows(k, j, j->k, K, b, h, 1.0f);
    copy_rows(v, j, j->v, V, b, h, 1.0f);
    TRANSPOSE(kt, k, T, D, Tp, Dp);
    float *z = j->out_z + b * j->s[Z][0] + h * j->s[Z][1];
    float *lse = j->lse ? j->lse + ((size_t)b * j->H + h) * T : NULL;
    float *P = j->P ? j->P + ((size_t)b * j->H + h) * T * Tp : NULL;
    const long long zt = j->s[Z][2];
    for (int i0 = 0; i0 < T; i0 += TILE_M) {
        const int i1 = min_int(T, i0 + TILE_M), M = i1 - i0, W = round_up(i1, TILE_N);
        prefetch_rows(j, next, i0, i1);
        for (int j0 = 0; j0 < W; j0 += TILE_N) /* S = (q/√D) kᵀ, keys up to the last query */
            TILE(M, TILE_N, D, q + (size_t)i0 * Dp, Dp, 1, kt + j0, Tp, S + j0, Tp, ONES);
        float inv[TILE_M], l[TILE_M];
        SOFTMAX(S, Tp, M, i0 + 1, W, l, inv);
        if (lse)
            memcpy(lse + i0, l, sizeof(float) * (size_t)M);
        product(M, i1, S, Tp, 1, v, Dp, z + i0 * zt, zt, D, inv); /* z = P v */
        if (P) /* P's rows for the backward, zero past each query's last key */
            for (int r = 0; r < M; r++) {
                COPY_ROW(P + (size_t)(i0 + r) * Tp, S + (size_t)r * Tp, W, inv[r]);
                memset(P + (size_t)(i0 + r) * Tp + W, 0, sizeof(float) * (size_t)(Tp - W));
            }
    }
}

/* P = exp(S − lse) (kt given; else P holds the forward's) and dS = P ∘ (dP − Δ) for queries
 * [i0, i1) into rows i0… of P and dS, zero past each query's last key (through i1 + 5 at
 * least, where dv and dk's tiles read). */
static void backward_block(const Job *j, int i0, int i1, const float *q, const float *kt,
                           const float *dz, const float *vt, const float *lse,
                           const float *delta, float *P, float *dS) {
    const int Tp = j->Tp, Dp = j->Dp, D = j->D, M = i1 - i0, W = round_up(i1, TILE_N);
    int Wz = min_int(Tp, round_up(i1 + TILE_M - 1, 8));
    Wz = Wz > W ? Wz : W;
    P += (size_t)i0 * Tp, dS += (size_t)i0 * Tp;
    for (int j0 = 0; j0 < W; j0 += TILE_N) {
        if (kt) /* S */
            TILE(M, TILE_N, D, q + (size_t)i0 * Dp, Dp, 1, kt + j0, Tp, P + j0, Tp, ONES);
        TILE(M, TILE_N, D, dz + (size_t)i0 * Dp, Dp, 1, vt + j0, Tp, dS + j0, Tp, ONES); /* dP */
    }
    for (int r = 0; r < M; r++) {
        const int i = i0 + r;
        if (kt)
            EXPS(P + (size_t)r * Tp, i + 1, Wz, lse[i]);
        DSCORES(P + (size_t)r * Tp, dS + (size_t)r * Tp, i + 1, Wz, delta[i]);
    }
}

/* Δ_i = Σ_d dz_id z_id from row copies (zero past D), eight partial sums a row. */
static void deltas(const float *dz, const float *z, float *delta, int T, int Dp) {
    for (int i = 0; i < T; i++, dz += Dp, z += Dp) {
        float acc[8] = {0};
        for (int d = 0; d < Dp; d += 8)
            for (int l = 0; l < 8; l++)
                acc[l] += dz[d + l] * z[d + l];
        const float lo = (acc[0] + acc[4]) + (acc[1] + acc[5]);
        delta[i] = lo + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
}

static void backward_item(const Job *j, int b, int h, int next, float *scratch) {
    const int T = j->T, D = j->D, Tp = j->Tp, Dp = j->Dp;
    const size_t rows = (size_t)Tp * Dp;
    float *q = scratch, *k = q + rows, *v = k + rows, *dz = v + rows, *kt = dz + rows;
    float *vt = kt + rows, *P = vt + rows, *dS = P + (size_t)Tp * Tp;
    float *delta = dS + (size_t)Tp * Tp;
    copy_rows(q, j, j->q, Q, b, h, j->scale);
    copy_rows(k, j, j->k, K, b, h, 1.0f);
    copy_rows(v, j, j->v, V, b, h, 1.0f);
    copy_rows(dz, j, j->dz, DZ, b, h, 1.0f);
    if (j->P) /* the forward's P: no scores to recompute */
        P = j->P + ((size_t)b * j->H + h) * T * Tp, kt = NULL;
    else
        TRANSPOSE(kt, k, T, D, Tp, Dp);
    TRANSPOSE(vt, v, T, D, Tp, Dp);
    copy_rows(v, j, j->z, Z, b, h, 1.0f); /* v's rows are done with: z's there */
    deltas(dz, v, delta, T, Dp);
    const float *lse = j->lse ? j->lse + ((size_t)b * j->H + h) * T : NULL;
    float *dq = j->dq + b * j->s[DQ][0] + h * j->s[DQ][1];
    float *dk = j->dk + b * j->s[DK][0] + h * j->s[DK][1];
    float *dv = j->dv + b * j->s[DV][0] + h * j->s[DV][1];
    const long long qt = j->s[DQ][2], kt_ = j->s[DK][2], vt_ = j->s[DV][2];
    float scale[TILE_M];
    for (int r = 0; r < TILE_M; r++)
        scale[r] = j->scale;
    for (int i0 = 0; i0 < T; i0 += TILE_M) {
        const int i1 = min_int(T, i0 + TILE_M);
        prefetch_rows(j, next, i0, i1);
        backward_block(j, i0, i1, q, kt, dz, vt, lse, delta, P, dS);
        /* dq = dS k/√D over the keys up to the block's last query */
        product(i1 - i0, i1, dS + (size_t)i0 * Tp, Tp, 1, k, Dp, dq + i0 * qt, qt, D, scale);
    }
    for (int j0 = 0; j0 < T; j0 += TILE_M) { /* over the queries from j0 on: */
        const int M = min_int(TILE_M, T - j0), n = T - j0;
        const size_t at = (size_t)j0 * Tp + j0;
        product(M, n, P + at, 1, Tp, dz + (size_t)j0 * Dp, Dp, dv + j0 * vt_, vt_, D, ONES);
        product(M, n, dS + at, 1, Tp, q + (size_t)j0 * Dp, Dp, dk + j0 * kt_, kt_, D, ONES);
    }
}

static void run_part(const void *job, int part, int parts) {
    const Job *j = job;
    int lo, hi;
    share(j->B * j->H, 1, part, parts, &lo, &hi);
    float *scratch = j->scratch + j->per_part * (size_t)part;
    for (int item = lo; item < hi; item++)
        (j->dz ? backward_item : forward_item)(j, item / j->H, item % j->H,
                                               item + 1 < hi ? item + 1 : -1, scratch);
}

/* ------------------------------------------------------------------------- Python -- */

#include "_module.h" /* ints(), use_portable(), kernel_name() */

/* Both entry points: n_ptr addresses, B, H, T, D, a tuple of strides, threads. */
static PyObject *run(PyObject *const *args, Py_ssize_t nargs, int backward) {
    const int n_ptr = backward ? 10 : 6, n_strides = backward ? 32 : 16;
    long long a[17], s[32];
    if (nargs != n_ptr + 6 || !PyTuple_Check(args[n_ptr + 4]) ||
        PyTuple_GET_SIZE(args[n_ptr + 4]) != n_strides) {
        PyErr_Format(PyExc_TypeError, "%s: %d addresses, B, H, T, D, %d strides, threads",
                     backward ? "backward" : "forward", n_ptr, n_strides);
        return NULL;
    }
    if (!ints(args, n_ptr + 4, a) || !ints(&PyTuple_GET_ITEM(args[n_ptr + 4], 0), n_strides, s) ||
        !ints(args + n_ptr + 5, 1, a + n_ptr + 4))
        return NULL;
    const long long *dims = a + n_ptr;
    if (dims[0] < 1 || dims[1] < 1 || dims[2] < 1 || dims[3] < 1 || dims[0] * dims[1] > INT32_MAX ||
        dims[2] > 65536 || dims[3] > 4096) {
        PyErr_Format(PyExc_ValueError, "flash: need 1 <= B*H, 1 <= T <= 65536, 1 <= D <= 4096; "
                     "got B %lld, H %lld, T %lld, D %lld", dims[0], dims[1], dims[2], dims[3]);
        return NULL;
    }
    Job j = {0};
    j.q = (const float *)(uintptr_t)a[0], j.k = (const float *)(uintptr_t)a[1];
    j.v = (const float *)(uintptr_t)a[2];
    j.P = (float *)(uintptr_t)a[5];
    if (backward) {
        j.z = (const float *)(uintptr_t)a[3], j.lse = (float *)(uintptr_t)a[4];
        j.dz = (const float *)(uintptr_t)a[6], j.dq = (float *)(uintptr_t)a[7];
        j.dk = (float *)(uintptr_t)a[8], j.dv = (float *)(uintptr_t)a[9];
        if (!j.lse && !j.P) {
            PyErr_SetString(PyExc_ValueError, "flash: the backward needs lse or P");
            return NULL;
        }
    } else {
        j.out_z = (float *)(uintptr_t)a[3], j.lse = (float *)(uintptr_t)a[4];
    }
    j.B = (int)dims[0], j.H = (int)dims[1], j.T = (int)dims[2], j.D = (int)dims[3];
    j.Tp = round_up(j.T, TILE_N), j.Dp = round_up(j.D, 8);
    j.scale = 1.0f / sqrtf((float)j.D);
    memcpy(j.s, s, sizeof(long long) * (size_t)n_strides); /* q, k, v, z (, dz, dq, dk, dv) */
    for (int m = backward ? DQ : Z; m <= (backward ? DV : Z); m++)
        if (j.s[m][3] != 1) {
            PyErr_SetString(PyExc_ValueError, "flash: z, dq, dk, dv need unit strides along d");
            return NULL;
        }
    int items = j.B * j.H, threads = (int)a[n_ptr + 4];
    threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    threads = threads > items ? items : threads;
    /* a second thread's wake-up costs about as much as 2^17 multiply-adds */
    if ((long long)items * j.T * j.T * j.D < (1LL << 18))
        threads = 1;
    j.per_part = scratch_floats(j.Tp, j.Dp);
    /* a whole number of cache lines: C11's aligned_alloc asks for it (macOS enforces it) */
    const size_t bytes = (sizeof(float) * j.per_part * (size_t)threads + 63) / 64 * 64;
    j.scratch = aligned_alloc(64, bytes); /* rows of 16 floats on whole cache lines */
    if (!j.scratch)
        return PyErr_NoMemory();
    memset(j.scratch, 0, bytes);
    Py_BEGIN_ALLOW_THREADS
    run_parts(run_part, &j, threads);
    Py_END_ALLOW_THREADS
    free(j.scratch);
    Py_RETURN_NONE;
}

static PyObject *forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return run(args, nargs, 0);
}

static PyObject *backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return run(args, nargs, 1);
}

static PyMethodDef methods[] = {
    {"forward", (PyCFunction)(void (*)(void))forward, METH_FASTCALL,
     "forward(q, k, v, z, lse, P, B, H, T, D, strides, threads): causal z = softmax(q kᵀ/√D) v"},
    {"backward", (PyCFunction)(void (*)(void))backward, METH_FASTCALL,
     "backward(q, k, v, z, lse, P, dz, dq, dk, dv, B, H, T, D, strides, threads): its gradients"},
    {"kernel", kernel_name, METH_NOARGS, "the kernels in use: 'avx2' or 'portable'"},
    {"use_portable", use_portable, METH_O, "use_portable(flag): force the portable loops (tests)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_flash",
                                    "Causal self-attention and its gradients, float32.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__flash(void) {
    pick_kernels(0);
    return PyModule_Create(&module);
}
