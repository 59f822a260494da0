"""Only the compiled extensions; everything else is in pyproject.toml.

- tokenizer/_fastbpe.c: the BPE encoder;
- kernels/_gemv.c: small-batch float32 products for decoding.

optional=True: without a C compiler the install still succeeds; the encoder then falls back
to tiktoken's core and the products to PyTorch's kernels (each says so once).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "glassgpt.tokenizer._fastbpe",
            ["src/glassgpt/tokenizer/_fastbpe.c"],
            depends=["src/glassgpt/tokenizer/_fastbpe_scan.h"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "glassgpt.kernels._gemv",
            ["src/glassgpt/kernels/_gemv.c"],
            depends=["src/glassgpt/kernels/_parallel.h"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
    ]
)
