"""Every tensor a model holds, wherever it keeps it, and a way to stand other tensors in for them.

A model keeps tensors in its parameters and buffers, and also in plain attributes: the packed weights
of a `FusedLinear`, an RMSNorm's constants, RoPE's cached tables (a dict of tuples). An exported graph
that takes every one of them as an input holds no copy of any weight, so one package serves any
checkpoint of the same shapes. A place is a path of steps from the model: ("attr", name) or
("item", key); tuples on the way are rebuilt when a tensor in them is replaced.
"""

import contextlib
import types

import torch
from torch import nn

# per-module dicts of callables (hooks): no tensors there
_SKIPPED = {"_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
            "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
            "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called",
            "_non_persistent_buffers_set"}
_OPAQUE = (type, types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.ModuleType, str, bytes,
           int, float, bool, torch.dtype, torch.device)


class NotExportable(Exception):
    """The model holds state an exported graph cannot take as tensors (e.g. a packed quantized kernel)."""


def tensor_places(model: nn.Module) -> list[tuple[tuple, torch.Tensor]]:
    """(place, tensor) of every distinct tensor `model` holds, in a fixed order."""
    found: list[tuple[tuple, torch.Tensor]] = []
    seen: set[int] = set()

    def walk(obj, place: tuple) -> None:
        if isinstance(obj, torch.Tensor):
            if id(obj) not in seen:
                seen.add(id(obj))
                found.append((place, obj))
            return
        if obj is None or isinstance(obj, _OPAQUE) or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, dict):
            steps = [(("item", k), v) for k, v in obj.items()]
        elif isinstance(obj, (tuple, list)):
            steps = [(("item", i), v) for i, v in enumerate(obj)]
        elif isinstance(obj, nn.Module) or hasattr(obj, "__dict__"):
            steps = [(("attr", k), v) for k, v in vars(obj).items() if k not in _SKIPPED]
        elif isinstance(obj, torch.ScriptObject):
            raise NotExportable(f"{'.'.join(str(s[1]) for s in place)} is a packed kernel ({type(obj).__name__})")
        else:
            return
        for step, value in steps:
            walk(value, place + (step,))

    walk(model, ())
    return found


def _get(obj, step):
    kind, key = step
    return getattr(obj, key) if kind == "attr" else obj[key]


def _replaced(obj, place: tuple, value):
    """`obj` with the tensor at `place` replaced by `value`: containers change in place, tuples are rebuilt."""
    if not place:
        return value
    step, rest = place[0], place[1:]
    child = _replaced(_get(obj, step), rest, value)
    kind, key = step
    if isinstance(obj, tuple):
        return obj[:key] + (child,) + obj[key + 1:]
    if kind == "attr":
        object.__setattr__(obj, key, child)  # past nn.Module.__setattr__ (a plain tensor where a Parameter was)
    else:
        obj[key] = child
    return obj


@contextlib.contextmanager
def standing_in(model: nn.Module, places: list[tuple], tensors: list[torch.Tensor]):
    """Within the block, the tensor at each of `places` in `model` is the matching one of `tensors`."""
    originals = [tensor_at(model, place) for place in places]
    try:
        for place, tensor in zip(places, tensors):
            _replaced(model, place, tensor)
        yield
    finally:
        for place, tensor in zip(places, originals):
            _replaced(model, place, tensor)


def tensor_at(obj, place: tuple):
    for step in place:
        obj = _get(obj, step)
    return obj
