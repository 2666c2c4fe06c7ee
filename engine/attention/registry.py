"""Attention backends by name: what `attention.backend` and `speculative.draft_attention_backend` accept."""

from eyas.engine.attention.torch_native import TorchNativeBackend
from eyas.engine.attention.triton import TritonBackend

BACKENDS: dict[str, type] = {
    TorchNativeBackend.name: TorchNativeBackend,
    TritonBackend.name: TritonBackend,
}
