"""Only the compiled encoder (tokenizer/_fastbpe.c); everything else is in pyproject.toml.

optional=True: without a C compiler the install still succeeds, and the engine falls back to
tiktoken's core (it says so once).
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
        )
    ]
)
