"""Where the kernel tests run their kernels: CUDA when there is a device, else CPU tensors in the
Triton interpreter.

The tests build CPU tensors and compare with CPU references. `on_device(wrapper)` runs a kernel
wrapper on the test device: every tensor argument (also inside tuples) is copied there, and copied
back into the caller's tensor afterwards, so outputs written in place land where the test reads them.
"""

import functools

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def on_device(wrapper):
    if DEVICE.type == "cpu":
        return wrapper

    @functools.wraps(wrapper)
    def run(*args, **kwargs):
        pairs = []

        def move(x):
            if isinstance(x, torch.Tensor):
                moved = x.to(DEVICE)
                pairs.append((x, moved))
                return moved
            if isinstance(x, tuple):
                items = [move(i) for i in x]
                return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
            return x

        result = wrapper(*[move(a) for a in args], **{k: move(v) for k, v in kwargs.items()})
        back = {id(moved): original for original, moved in pairs}
        for original, moved in pairs:
            original.copy_(moved.cpu())

        def restore(x):
            if isinstance(x, torch.Tensor):
                return back.get(id(x), x.cpu())
            if isinstance(x, tuple):
                items = [restore(i) for i in x]
                return type(x)(*items) if hasattr(x, "_fields") else tuple(items)
            return x

        return restore(result)

    return run
