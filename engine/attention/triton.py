"""Attention with the Triton kernels of `kernels/`: paged KV store, split-K decode, extend/verify.

Runs on CUDA, or on CPU tensors in the Triton interpreter (`TRITON_INTERPRET=1`, slow; the tests'
mode). The kernel modules are imported when the first backend is built: Triton reads
`TRITON_INTERPRET` when a kernel is defined, so importing the engine defines none.

A forward where every request extends by exactly one token (plain decode, the draft decode steps)
runs the decode kernel; any other (prefill, verify, draft-extend) runs the extend kernel, causal over
the new tokens, or under the batch's tree mask when it carries one: `batch.custom_mask`, a flat
bool/uint8 tensor of per-request row-major [extend_len, extend_len] blocks (query j sees new token i),
optionally with `batch.mask_offsets` [B] (default: the blocks packed in request order).
"""

import os
from dataclasses import dataclass
from itertools import accumulate

import torch

from eyas.engine.attention.torch_native import TorchNativeBackend
from eyas.engine.errors import ConfigError
from eyas.engine.forward_batch import ForwardBatch

_TRUE = ("1", "true", "on", "yes", "y")


def _interpreter_requested() -> bool:
    try:
        import triton
    except ImportError as exc:
        raise ConfigError("attention backend 'triton' needs the `triton` package; "
                          f"allowed without it: {_other_backends()}") from exc
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


def _other_backends() -> str:
    return TorchNativeBackend.name  # the backend that runs wherever torch does


def _defined_in_interpreter(kernel) -> bool:
    # an @autotune kernel wraps the @jit one in `.fn`; the interpreter defines InterpretedFunction
    fn = getattr(kernel, "fn", kernel)
    return type(fn).__name__ == "InterpretedFunction"


@dataclass
class TritonMetadata:
    req_rows: torch.Tensor  # [B] rows of the request-to-token table
    prefix_lens: torch.Tensor  # [B] int64
    extend_lens: torch.Tensor  # [B] int64
    extend_starts: torch.Tensor  # [B] int64, first packed row of each request's new tokens
    seq_lens: torch.Tensor  # [B] int64, prefix + extend
    max_extend_len: int
    is_decode: bool  # every request extends by one token
    num_kv_splits: int  # decode only
    custom_mask: torch.Tensor | None  # flat bool/uint8, None = causal
    mask_offsets: torch.Tensor | None  # [B] int64 start of each request's mask block


class TritonBackend:
    name = "triton"
    max_kv_splits = 16  # decode split-K: chunks per sequence at most
    tokens_per_split = 128  # ... and at least this many tokens per chunk

    def __init__(self, head_dim: int):
        if not torch.cuda.is_available() and not _interpreter_requested():
            raise ConfigError(
                "attention backend 'triton' needs a CUDA device, or TRITON_INTERPRET=1 to run its kernels in "
                f"the Triton interpreter (slow); allowed here: {_other_backends()}")
        from eyas.kernels import decode_attention, extend_attention, store_kv

        self._store_kv = store_kv.store_kv
        self._decode_attention = decode_attention.decode_attention
        self._decode_workspace = decode_attention.decode_workspace
        self._extend_attention = extend_attention.extend_attention
        self.interpreted = _defined_in_interpreter(store_kv._store_kv_kernel)
        if not self.interpreted and not torch.cuda.is_available():
            raise ConfigError(
                "attention backend 'triton': TRITON_INTERPRET=1 is set but the kernels in kernels/ were defined "
                "before it was (set it before importing kernels or engine modules that use them)")
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5
        self.metadata: TritonMetadata | None = None
        self._workspace = None  # DecodeWorkspace [max_batch, Hq, max_kv_splits, D], grown on demand

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        device = batch.req_rows.device
        if device.type != "cuda" and not self.interpreted:
            raise ConfigError(f"attention backend 'triton': tensors are on {device}, but its kernels were "
                              "compiled for CUDA; use device=cuda, or TRITON_INTERPRET=1 for CPU tensors")
        prefix, extend = list(batch.prefix_lens), list(batch.extend_lens)
        starts = [0, *accumulate(extend)][:-1]
        seq = [p + e for p, e in zip(prefix, extend)]
        lens = torch.tensor([prefix, extend, starts, seq], dtype=torch.int64).to(device, non_blocking=True)
        custom_mask = getattr(batch, "custom_mask", None)
        mask_offsets = None
        if custom_mask is not None:
            mask_offsets = getattr(batch, "mask_offsets", None)
            if mask_offsets is None:
                blocks = [e * e for e in extend]
                mask_offsets = torch.tensor([0, *accumulate(blocks)][:-1], dtype=torch.int64, device=device)
        self.metadata = TritonMetadata(
            req_rows=batch.req_rows, prefix_lens=lens[0], extend_lens=lens[1], extend_starts=lens[2], seq_lens=lens[3],
            max_extend_len=max(extend, default=0), is_decode=custom_mask is None and all(e == 1 for e in extend),
            num_kv_splits=self.num_kv_splits(max(seq, default=0)), custom_mask=custom_mask, mask_offsets=mask_offsets)

    @classmethod
    def num_kv_splits(cls, max_seq_len: int) -> int:
        """Decode split-K chunks for a batch whose longest sequence has `max_seq_len` tokens."""
        return min(cls.max_kv_splits, max(1, -(-max_seq_len // cls.tokens_per_split)))

    def forward(self, q, k, v, layer_id: int, batch: ForwardBatch) -> torch.Tensor:
        """q: [N, Hq, D], k/v: [N, Hkv, D] -> [N, Hq, D] in q's dtype."""
        meta = self.metadata
        k_cache, v_cache = batch.kv_pool.k[layer_id], batch.kv_pool.v[layer_id]
        slots = batch.out_cache_loc if batch.out_cache_loc.dtype == torch.int64 else batch.out_cache_loc.long()
        self._store_kv(k_cache, v_cache, k, v, slots)
        table = batch.req_to_token
        if meta.is_decode:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            workspace = self._decode_workspace_for(q.shape[0], q.shape[1], q.device, meta.num_kv_splits)
            return self._decode_attention(q, k_cache, v_cache, table, meta.req_rows, meta.seq_lens, out, self.scale,
                                          num_kv_splits=meta.num_kv_splits, workspace=workspace)
        # the extend kernel needs q in the cache's dtype
        q_run = q if q.dtype == k_cache.dtype else q.to(k_cache.dtype)
        out = torch.empty(q_run.shape, dtype=q_run.dtype, device=q_run.device)
        self._extend_attention(q_run, k_cache, v_cache, table, meta.req_rows, meta.prefix_lens, meta.extend_lens,
                               meta.extend_starts, out, self.scale, meta.max_extend_len,
                               custom_mask=meta.custom_mask, mask_offsets=meta.mask_offsets)
        return out if out.dtype == q.dtype else out.to(q.dtype)

    def _decode_workspace_for(self, batch_size: int, num_heads: int, device: torch.device, num_kv_splits: int):
        ws = self._workspace
        if (ws is None or ws.partial_out.shape[0] < batch_size or ws.partial_out.shape[1] != num_heads
                or ws.partial_out.device != device):
            capacity = max(batch_size, 2 * ws.partial_out.shape[0] if ws is not None else 8)
            ws = self._workspace = self._decode_workspace(capacity, num_heads, self.max_kv_splits, self.head_dim,
                                                          device)
        # the kernels index by strides: a view over the first splits is a valid workspace
        return type(ws)(ws.partial_out[:, :, :num_kv_splits], ws.partial_lse[:, :, :num_kv_splits])
