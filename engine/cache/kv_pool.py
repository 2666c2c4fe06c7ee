"""One model's paged KV cache: K and V of every layer over a flat array of token slots.

Slot `s` lives on page `s // page_size`. The slot `-1` never names a real entry: padded rows of a
batch carry it, and their writes land in one extra scratch row at the end of each layer's tensor
(index -1), which no request owns and nothing reads; so a store needs no check on the host.
"""

import numpy as np
import torch


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor. On a CPU its pages are the kernel's zero pages until first written (numpy's zeros is
    calloc): a pool is mostly empty at first, and filling gigabytes with zeros took 2.5 s of a start; the
    pages a step first writes are faulted in then. Aligned to 64 bytes, as torch's allocator aligns."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    size = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    raw = np.zeros(size + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    return torch.from_numpy(raw[start:start + size]).view(dtype).view(shape)


class PagedKVPool:
    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_slots = num_pages * page_size
        shape = (self.num_slots + 1, num_kv_heads, head_dim)  # + the scratch row of slot -1
        self.k = [zeroed(shape, dtype, device) for _ in range(num_layers)]
        self.v = [zeroed(shape, dtype, device) for _ in range(num_layers)]

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        # slots: [N] (-1 = skip: the scratch row); k, v: [N, Hkv, D]
        k_cache, v_cache = self.k[layer_id], self.v[layer_id]
        k_cache.index_put_((slots,), k if k.dtype == k_cache.dtype else k.to(k_cache.dtype))
        v_cache.index_put_((slots,), v if v.dtype == v_cache.dtype else v.to(v_cache.dtype))

    def store_run(self, layer_id: int, first_slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store N tokens into the consecutive slots first_slot .. first_slot + N - 1 (one copy, no index)."""
        end = first_slot + k.shape[0]
        self.k[layer_id][first_slot:end].copy_(k)
        self.v[layer_id][first_slot:end].copy_(v)
