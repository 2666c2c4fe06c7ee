"""One model's paged KV cache: K and V of every layer over a flat array of token slots.

Slot `s` lives on page `s // page_size`. The slot `-1` never names a real entry: writes to it are
skipped (padded rows of a batch carry it).
"""

import torch


class PagedKVPool:
    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        self.num_slots = num_pages * page_size
        shape = (self.num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def store(self, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        # slots: [N] (-1 = skip); k, v: [N, Hkv, D]
        keep = slots >= 0
        if not bool(keep.all()):
            slots, k, v = slots[keep], k[keep], v[keep]
        self.k[layer_id][slots] = k.to(self.k[layer_id].dtype)
        self.v[layer_id][slots] = v.to(self.v[layer_id].dtype)
