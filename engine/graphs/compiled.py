"""Inductor-compiled forwards (measured and tested on CPU): one compiled function per (model, pool,
captured layers, tree or not), shared by every runner of that structure, with symbolic batch, width
and context sizes.

A size of 1 is specialised by the compiler, so a structure holds up to four graphs (one request or
more, one token each or more); each is compiled on first use and reused for every other size. Guards
on the model's parameters are skipped (they never change after load); guards on the inputs' shapes,
dtypes and devices stay.
"""

import itertools
import logging
import os
import time
import types
import weakref

import torch

from eyas.engine.graphs.graph_attention import GraphAttention, paged_kernel_runs
from eyas.engine.graphs.graph_forward import graph_forward
from eyas.engine.models.llama import RMSNorm
from eyas.engine.models.rope import RotaryEmbedding

log = logging.getLogger("eyas.graphs")
_SERIAL = itertools.count()

# (id(model), id(pool), capture layers, tree) -> its forward, while a runner holds it (it holds the model)
_COMPILED: "weakref.WeakValueDictionary[tuple, CompiledForward]" = weakref.WeakValueDictionary()


class CompiledForward:
    def __init__(self, model, kv_pool, capture_layers: tuple[int, ...], tree: bool, max_position: int):
        attention = GraphAttention(model.config.head_dim, paged_kernel_runs(kv_pool))
        prepare_model(model, max_position)
        self.name = f"{type(model).__name__}{' tree' if tree else ''}"
        self.shapes_seen: set[tuple[bool, bool]] = set()  # (one request, one token each) of the graphs compiled
        self.compile_s = 0.0

        def forward(tokens, positions, out_cache_loc, context_slots, prefix_lens=None, node_mask=None, **model_inputs):
            return graph_forward(model, kv_pool, attention, max_position, capture_layers, tokens, positions,
                                 out_cache_loc, context_slots, prefix_lens, node_mask, **model_inputs)

        # a code object of its own, and a name of its own: the compiler caches graphs per code object (with
        # the parameters' guards skipped, two models sharing one could run each other's graphs) and keeps
        # what it learns about sizes per code name (shared, two models' constants would turn symbolic)
        name = f"graph_forward_{next(_SERIAL)}"
        forward = types.FunctionType(forward.__code__.replace(co_name=name, co_qualname=name), forward.__globals__,
                                     name, forward.__defaults__, forward.__closure__)
        # a C++ wrapper calls the graph's kernels: less host time per call than the Python wrapper's
        self._compiled = torch.compile(forward, fullgraph=True, dynamic=None, options={
            "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe, "cpp_wrapper": True})

    def __call__(self, tokens, positions, out_cache_loc, context_slots, **named):
        # batch, width and context are symbolic; the sizes of the model's own dims are not
        for tensor in (tokens, positions, out_cache_loc, context_slots, named.get("node_mask")):
            if tensor is not None:
                torch._dynamo.mark_dynamic(tensor, tuple(range(tensor.dim())))
        for name, tensor in named.items():
            if name != "node_mask":  # prefix lens [B]; a draft model's features [T, H]
                torch._dynamo.mark_dynamic(tensor, 0)
        shape = (tokens.shape[0] == 1, tokens.shape[1] == 1)
        if shape in self.shapes_seen:
            return self._compiled(tokens, positions, out_cache_loc, context_slots, **named)
        log.warning("compiling the %s forward for %s request%s of %s token%s (once; inductor caches it on disk)",
                    self.name, *(("one", "") if shape[0] else ("several", "s")), *(("one", "") if shape[1] else ("several", "s")))
        start = time.perf_counter()
        out = self._compiled(tokens, positions, out_cache_loc, context_slots, **named)
        self.compile_s += time.perf_counter() - start
        self.shapes_seen.add(shape)
        return out


def compiled_forward(model, kv_pool, capture_layers: tuple[int, ...], tree: bool, max_position: int,
                     cache_dir: str | None = None) -> CompiledForward:
    """The compiled `graph_forward` of `model` over `kv_pool` (built on first use, then shared)."""
    key = (id(model), id(kv_pool), tuple(capture_layers), tree)
    compiled = _COMPILED.get(key)
    if compiled is None:
        if cache_dir is not None:  # inductor reads it process-wide: the last engine to set it wins
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.abspath(os.path.expanduser(cache_dir))
        compiled = _COMPILED[key] = CompiledForward(model, kv_pool, tuple(capture_layers), tree, max_position)
    return compiled


def prepare_model(model, max_position: int) -> None:
    """Make now the tensors `model`'s forwards would make lazily: every RoPE cache grown past `max_position`,
    every norm's constants. A graph reads the same tensors eager forwards read, and a traced forward
    leaves no tensor of its own behind in the model."""
    dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.tables(torch.zeros(1, dtype=torch.int64, device=module.inv_freq.device), dtype, max_position)
        elif isinstance(module, RMSNorm):
            module.constants_on(module.weight.device)
