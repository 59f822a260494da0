/* glassgpt.kernels._rowwise: the small float32 kernels that the seams of glassgpt.kernels call
 * around the products and attention, by glassgpt's own loops, each family in its own header:
 *
 *   _norms.h      layer norm and RMS norm: a decoding step's few rows, a training step's
 *                 rows with their statistics, and the backward
 *   _gelu.h       the tanh and exact GELUs over whole activations, their gradients, and the
 *                 tanh GELU with its slope in one pass
 *   _kvcache.h    a decoding step's KV-cache writes and its lengths' advance
 *   _residual.h   a replayed decoding step's embedding and residual sums
 *   _rope.h       a decoding step's rotary embedding, its table rows, SiLU and products
 *   _clip.h       gradient clipping: Σ x² over many buffers, and their scaling
 *   _transpose.h  the transpose of a matrix (oneDNN's ∂W = xᵀ g)
 *   _argmax.h     greedy decoding's first largest index of each row
 *   _nucleus.h    top-p's drop mask of each row, without sorting the vocabulary; min-p
 *   _topk.h       top-k's threshold without a sort, the inverse-CDF draw, the finite check
 *
 * A decoding step's few rows on one thread: PyTorch's kernels spend most of a call on set-up
 * when the input is one row of 768 values (10-17 µs in a decoding step against about 1 µs of
 * arithmetic); these do the arithmetic alone. A training step's GELU and norms over whole
 * activations in parts on PyTorch's threads (_parallel.h: one thread pool, and one pacing for
 * the process; the families are headers of one translation unit): one
 * pass each, where PyTorch's tanh GELU takes a slow vectorised tanh and its σ form four
 * passes ([12, 64, 512], 2 threads: forward 127 µs against 476 for the σ form, forward and
 * backward 307 against 1,131).
 *
 * Python API (addresses of contiguous float32 buffers as ints; the caller checks shapes,
 * dtypes and devices; the GIL is held through the short calls): each family's header lists
 * its functions; and
 *   kernel() → "avx2" or "portable";  use_portable(flag) → the kernel now in use (tests)
 */
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_cpu.h"
#include "_parallel.h"
#if GG_X86
#include "_vexp.h"
#endif
#include "_silu.h"

static const char *KERNEL_NAME = "portable";
static void pick_kernels(int portable);

#include "_module.h" /* ints(), use_portable(), kernel_name() */
#include "_program.h" /* KernelEntry, run_entry(), export_impls() */

/* The parts of a run over `items` units of work (chunks, blocks of rows, groups of columns)
 * on `threads` threads: 1 to 256, and no more than the items. */
static int part_count(long long threads, int items) {
    int parts = threads < 1 ? 1 : threads > 256 ? 256 : (int)threads;
    return parts < items ? parts : items > 0 ? items : 1;
}

#include "_norms.h"
#include "_gelu.h"
#include "_kvcache.h"
#include "_residual.h"
#include "_rope.h"
#include "_clip.h"
#include "_transpose.h"
#include "_argmax.h"
#include "_nucleus.h"
#include "_topk.h"

/* Every family's AVX2 + FMA kernels where the CPU has them (and `portable` is 0), else the
 * portable loops. */
static void pick_kernels(int portable) {
    const int avx2 = !portable && cpu_has_avx2();
    pick_norms(avx2), pick_gelu(avx2), pick_clip(avx2), pick_transpose(avx2), pick_argmax(avx2);
    pick_nucleus(avx2);
    pick_transpose16(avx2);
    pick_rope(avx2);
    KERNEL_NAME = avx2 ? "avx2" : "portable";
}

/* The implementations a replayed step's program calls (kernels/_program.h). */
static const KernelEntry *const IMPLS[] = {&EMBED,   &NORM_ENTRY, &GELU_MANY, &KV_WRITE,
                                           &KV_WRITE_ROWS, &ADVANCE, &ADD,   &MUL,
                                           &SILU_ENTRY,    &ROPE,    &TAKE_ROWS, &SCALE_MANY,
                                           NULL};

static PyMethodDef methods[] = {
    {"argmax_rows", (PyCFunction)(void (*)(void))argmax_rows, METH_FASTCALL,
     "argmax_rows(z, B, V, stride) -> each row's first largest index, or None where a row is not finite"},
    {"top_p_drop", (PyCFunction)(void (*)(void))top_p_drop, METH_FASTCALL,
     "top_p_drop(probs, p, drop, B, V, threads, z, out) -> False where a row is negative or infinite"},
    {"min_p_fill", (PyCFunction)(void (*)(void))min_p_fill, METH_FASTCALL,
     "min_p_fill(z, log_m, out, B, V): out = z, -inf where z - max z < log m"},
    {"top_k_fill", (PyCFunction)(void (*)(void))top_k_fill, METH_FASTCALL,
     "top_k_fill(z, k, out, B, V, threads) -> out = z, -inf below each row's k-th largest"},
    {"draw_rows", (PyCFunction)(void (*)(void))draw_rows, METH_FASTCALL,
     "draw_rows(probs, cdf, u, ids, B, V): each row's inverse-CDF draw (filters.draw's rest)"},
    {"finite_rows", (PyCFunction)(void (*)(void))finite_rows, METH_FASTCALL,
     "finite_rows(z, ok, B, V) -> whether every row holds a finite value (ok: each row's)"},
    {"kv_write_rows", (PyCFunction)(void (*)(void))kv_write_rows, METH_FASTCALL,
     "kv_write_rows(K, V, k, v, B, H, D, lengths, strides): K[b, :, lengths[b]] = k[b, :, 0]"},
    {"advance", (PyCFunction)(void (*)(void))advance, METH_FASTCALL,
     "advance(lengths, B, T): lengths[:B] += T (int64)"},
    {"add", (PyCFunction)(void (*)(void))add, METH_FASTCALL, "add(a, b, y, n): y = a + b"},
    {"mul", (PyCFunction)(void (*)(void))mul, METH_FASTCALL, "mul(a, b, y, n): y = a * b"},
    {"silu", (PyCFunction)(void (*)(void))silu, METH_FASTCALL, "silu(x, y, n): y = x sigmoid(x)"},
    {"rope", (PyCFunction)(void (*)(void))rope, METH_FASTCALL,
     "rope(x, cos, sin, y, B, heads, D, r, sb, sh, cs): each pair 2i < r rotated"},
    {"take_rows", (PyCFunction)(void (*)(void))take_rows, METH_FASTCALL,
     "take_rows(table, y, B, d, pos, positions): y[b] = table[positions[b] or pos]"},
    {"embed", (PyCFunction)(void (*)(void))embed, METH_FASTCALL,
     "embed(W_E, tokens, P, y, B, d, n_vocab, pos, positions): y[b] = W_E[tokens[b]] (+ P[·])"},
    {"norm", (PyCFunction)(void (*)(void))norm, METH_FASTCALL,
     "norm(x, w, b, y, rows, d, eps, centred): layer norm (centred) or RMS norm of each row"},
    {"gelu_slope", (PyCFunction)(void (*)(void))gelu_slope, METH_FASTCALL,
     "gelu_slope(x, y, d, n, threads): y = GELU(x), d = GELU'(x) (tanh), in one pass"},
    {"gelu_many", (PyCFunction)(void (*)(void))gelu_many, METH_FASTCALL,
     "gelu_many(x, g, y, n, threads, exact): y = GELU(x) (g = 0) or g GELU'(x), in parallel"},
    {"kv_write", (PyCFunction)(void (*)(void))kv_write, METH_FASTCALL,
     "kv_write(K, V, k, v, B, H, T, D, n, strides): K[:, :, n:n+T] = k, V[:, :, n:n+T] = v"},
    {"sum_squares", (PyCFunction)(void (*)(void))sum_squares, METH_FASTCALL,
     "sum_squares(addresses, lengths, threads): the sum of x² over float32 buffers, in float64"},
    {"scale_many", (PyCFunction)(void (*)(void))scale_many, METH_FASTCALL,
     "scale_many(addresses, lengths, factor, threads): x *= factor in each float32 buffer"},
    {"norm_train", (PyCFunction)(void (*)(void))norm_train, METH_FASTCALL,
     "norm_train(x, w, b, y, stats, rows, d, eps, centred, threads): a norm, keeping μ, s"},
    {"norm_train_backward", (PyCFunction)(void (*)(void))norm_train_backward, METH_FASTCALL,
     "norm_train_backward(x, w, stats, g, dx, dw, db, rows, d, centred, threads)"},
    {"transpose", (PyCFunction)(void (*)(void))transpose, METH_FASTCALL,
     "transpose(x, y, rows, cols, threads): y [cols, rows] = the transpose of x [rows, cols]"},
    {"transpose16", (PyCFunction)(void (*)(void))transpose16, METH_FASTCALL,
     "transpose16(x, y, rows, cols, threads): the same for 16-bit values (bf16, float16)"},
    {"kernel", kernel_name, METH_NOARGS, "the kernels in use: 'avx2' or 'portable'"},
    {"use_portable", use_portable, METH_O, "use_portable(flag): force the portable loops (tests)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rowwise",
                                    "Norms, GELUs, KV-cache writes, clipping, transposes and argmaxes, float32.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__rowwise(void) {
    pick_kernels(0);
    return export_impls(PyModule_Create(&module), IMPLS);
}
