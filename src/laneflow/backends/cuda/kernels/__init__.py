"""The generated CUDA kernels (NVRTC): elementwise, fused, reductions, copies, indexing, random.
``backends/cuda/dispatch.py`` says which one runs each primitive kind."""
