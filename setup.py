"""The compiled extensions; everything else is in pyproject.toml.

- ``glassgpt.tokenizer._fastbpe``: the compiled BPE encoder;
- ``glassgpt.kernels._int8``: the int8 weight-only product for decoding (AVX2+FMA where the
  CPU has it, chosen at run time, else a portable loop).

optional=True: without a C compiler the install still succeeds; the tokenizer falls back to
tiktoken's core and int8 products to float32 ones with the same weights (each says so once).
"""

import sys

from setuptools import Extension, setup

threads = [] if sys.platform == "win32" else ["-pthread"]

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
            "glassgpt.kernels._int8",
            ["src/glassgpt/kernels/_int8.c"],
            extra_compile_args=["-O3", *threads],
            extra_link_args=threads,
            optional=True,
        ),
    ]
)
