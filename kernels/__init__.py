"""Triton kernels, each behind a torch-facing wrapper."""
