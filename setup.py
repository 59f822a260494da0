"""The compiled extensions; everything else is in pyproject.toml.

- ``glassgpt.tokenizer._fastbpe``: the compiled BPE encoder;
- ``glassgpt.kernels._gemv``: small-batch float32 products for decoding;
- ``glassgpt.kernels._attend``: attention for a few queries over a KV cache (decoding);
- ``glassgpt.kernels._int8``: the int8 weight-only product for decoding;
- ``glassgpt.kernels._int4``: the int4 (groups of 32, float16 scales) product for decoding;
- ``glassgpt.kernels._rowwise``: the small kernels around the products, one header a family
  (``kernels/_norms.h``, ``_gelu.h``, ``_kvcache.h``, ``_residual.h``, ``_rope.h``, ``_clip.h``,
  ``_transpose.h``, ``_argmax.h``, ``_nucleus.h``, ``_topk.h``): a decoding step's norms, GELUs and KV-cache
  writes on its few rows, a training step's norms and GELUs with their gradients, gradient
  clipping, a sampler's filters (top-k, top-p, min-p) and its draw;
- ``glassgpt.kernels._flash``: causal self-attention and its gradients for small heads
  (training, and a prompt's forward);
- ``glassgpt.kernels._program``: a replayed decoding step's calls as one compiled call (the
  other extensions' implementations, found through their ``_impls`` capsules).

The kernels use AVX2+FMA where the CPU has it (chosen at run time, ``kernels/_cpu.h`` for the
float32 ones, else a portable loop) and run their parts on PyTorch's own OpenMP threads
(``kernels/_parallel.h``).

optional=True: without a C compiler the install still succeeds; the tokenizer falls back to
tiktoken's core, float32 products and attention (both kernels) to PyTorch's kernels and int8
products to float32 ones
with the same weights (each says so once), the norms and GELU to PyTorch's.
"""

from setuptools import Extension, setup

KERNELS = "src/glassgpt/kernels"
SHARED = ("_parallel", "_cpu", "_vexp", "_silu", "_tile", "_flash_rows", "_module", "_program")
# the extensions' own headers: _rowwise.c is one translation unit of its families
OWN = {
    "_rowwise": (
        "_norms",
        "_gelu",
        "_kvcache",
        "_residual",
        "_rope",
        "_clip",
        "_transpose",
        "_argmax",
        "_nucleus",
        "_topk",
    )
}


def kernel(name: str) -> Extension:
    """``glassgpt.kernels.<name>`` from ``kernels/<name>.c`` and the headers it includes."""
    return Extension(
        f"glassgpt.kernels.{name}",
        [f"{KERNELS}/{name}.c"],
        depends=[f"{KERNELS}/{h}.h" for h in (*SHARED, *OWN.get(name, ()))],
        extra_compile_args=["-O3"],
        optional=True,
    )


setup(
    ext_modules=[
        Extension(
            "glassgpt.tokenizer._fastbpe",
            ["src/glassgpt/tokenizer/_fastbpe.c"],
            depends=["src/glassgpt/tokenizer/_fastbpe_scan.h"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        *(
            kernel(name)
            for name in ("_gemv", "_attend", "_int8", "_int4", "_rowwise", "_flash", "_program")
        ),
    ]
)
