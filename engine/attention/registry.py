"""Attention backends by name: what `attention.backend` and `speculative.draft_attention_backend` accept."""

from engine.attention.torch_native import TorchNativeBackend
from engine.attention.triton import TritonBackend

BACKENDS: dict[str, type] = {
    TorchNativeBackend.name: TorchNativeBackend,
    TritonBackend.name: TritonBackend,
}
