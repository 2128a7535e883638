"""Builds the one native helper (atomics and futex waits on shared memory)."""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("ptodist._atomics", ["src/ptodist/_native/atomics.c"], extra_compile_args=["-O2"]),
    ]
)
