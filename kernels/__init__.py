"""Triton kernels, and a CPU GEMM in C++ built on first use, each behind a torch-facing wrapper."""
