"""Kernels over opaque packed weights, as ops a compiled graph can call.

fbgemm's packed weights are script objects no graph can take as an input: graphs call them through
the ops below by handle (an int); a handle's entry goes when the object that registered it is
collected. oneDNN's reordered weights (`torch._mkldnn` tensors) are tensors a graph takes as inputs,
but inductor would lower its own oneDNN op over them as if they were strided (it packs only frozen
constants): an op of our own keeps them opaque.
"""

import itertools
import weakref

import torch

_PACKED: dict[int, object] = {}
_HANDLES = itertools.count()


def register_packed(owner, packed) -> int:
    """A handle for `packed`, valid while `owner` lives."""
    handle = next(_HANDLES)
    _PACKED[handle] = packed
    weakref.finalize(owner, _PACKED.pop, handle, None)
    return handle


@torch.library.custom_op("eyas::fbgemm_int8_linear", mutates_args=())
def _fbgemm_int8_linear(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic(x, _PACKED[handle], True)


@torch.library.custom_op("eyas::fbgemm_fp16_linear", mutates_args=())
def _fbgemm_fp16_linear(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic_fp16(x, _PACKED[handle])


@torch.library.custom_op("eyas::onednn_linear", mutates_args=())
def onednn_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [None], "")


@_fbgemm_int8_linear.register_fake
@_fbgemm_fp16_linear.register_fake
@onednn_linear.register_fake
def _linear_shape(x: torch.Tensor, weights, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)
