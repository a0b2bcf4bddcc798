"""Build of the native extensions; every other piece of metadata lives in pyproject.toml.

`dllm_constrain.constraints._native` is the token-trie walk of the constraint layer (the hot loop of mask
computation) and the grouping of its output; `dllm_constrain.constraints._terms` the term algebra of its derivative
DFA (the rows the walk meets first); `dllm_constrain.kernels._bitmask_cpu` masks float32 logits in place by a
token bitmask on the CPU. All three are optional: without a C compiler the build goes on without them and the
package uses its numpy walker, its Python term algebra (deriv_terms.Terms) and torch's masked_fill instead (same
results), so `pip install` never fails for want of a compiler.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dllm_constrain.constraints._native",
            sources=["dllm_constrain/constraints/_native.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "dllm_constrain.constraints._terms",
            sources=["dllm_constrain/constraints/_terms.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "dllm_constrain.kernels._bitmask_cpu",
            sources=["kernels/_bitmask_cpu.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
