"""Our own CUDA kernels (the `fused` renderer backend), built lazily: importing this package compiles nothing.

`build.load()` compiles csrc/ on first use (or loads a prebuilt module) and caches it; `ops` holds the thin
Python wrappers and autograd Functions around the kernels.
"""
