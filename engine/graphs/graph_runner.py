"""GraphRunner: one phase's target or draft forward (decode, verify, a draft step) run as a graph.

A runner takes batches of equal width (new tokens per request) up to the largest batch bucket and the
largest context; anything else (prefill, ragged extends, larger batches) stays eager, and `fits` says
which. Chains (causal) and trees (a node mask) are two structures; each is one symbolic-size compiled
graph shared by every runner of the same model (`compiled.py`), so a runner is cheap to build per
runtime state and compiles nothing until a batch first runs through it.
"""

import torch

from eyas.engine.forward_batch import ForwardBatch
from eyas.engine.graphs.compiled import CompiledForward, compiled_forward
from eyas.engine.graphs.exported import ExportedForward, exported_forward
from eyas.engine.graphs.settings import GraphSettings


class GraphRunner:
    def __init__(self, model, kv_pool, req_to_token: torch.Tensor, settings: GraphSettings, phase: str,
                 capture_layers: tuple[int, ...] = (), max_width: int | None = None, chains_only: bool = False):
        """max_width: the most new tokens per request this phase runs as a graph (decode and draft steps: 1,
        so a prefill of equal-length prompts stays eager); None: any. chains_only: trees stay eager (a
        batch-invariant target's verify: a tree's graph does not attend its nodes as their decodes would)."""
        if not settings.enabled:
            raise ValueError("a GraphRunner needs graphs.mode=compile or aot")
        self.model = model
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token
        self.settings = settings
        self.phase = phase
        self.capture_layers = tuple(capture_layers)
        self.max_width = max_width
        self.chains_only = chains_only
        self.num_runs = 0  # forwards this runner ran as a graph (the phase's other forwards ran eager)
        # tree or not -> the shared compiled or exported forward (held here)
        self._forwards: dict[bool, CompiledForward | ExportedForward] = {}

    def __repr__(self) -> str:
        return f"GraphRunner({self.phase}, {self.settings.mode})"

    def fits(self, batch: ForwardBatch) -> bool:
        width = batch.extend_lens[0]
        return (batch.batch_size <= self.settings.max_batch_size
                and min(batch.extend_lens) == width == max(batch.extend_lens)
                and (self.max_width is None or width <= self.max_width)
                and not (self.chains_only and batch.custom_mask is not None)
                # aot packages are exported for contexts of 2 positions up (a size of 1 is a graph of its own)
                and 2 <= max(batch.seq_lens) <= self.settings.max_context[-1])

    def run(self, batch: ForwardBatch, **model_inputs) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(hidden [N, H], aux) of `batch` (which `fits`), as the eager forward computes them."""
        b, w = batch.batch_size, batch.extend_lens[0]
        tree = {}
        if batch.custom_mask is not None:
            tree = {"prefix_lens": torch.tensor(batch.prefix_lens, dtype=torch.int64, device=batch.input_ids.device),
                    "node_mask": batch.custom_mask.view(b, w, w).bool()}
        context_slots = batch.req_to_token[batch.req_rows, :max(batch.seq_lens)]  # a tree step may bring its own table
        self.num_runs += 1
        return self.forward(bool(tree))(batch.input_ids.view(b, w), batch.positions.view(b, w),
                                        batch.out_cache_loc.view(b, w), context_slots, **tree, **model_inputs)

    def forward(self, tree: bool) -> CompiledForward | ExportedForward:
        if tree not in self._forwards:
            max_position = self.req_to_token.shape[1] - 1
            if self.settings.mode == "aot":
                self._forwards[tree] = exported_forward(self.model, self.kv_pool, self.capture_layers, tree, max_position,
                                                        self.settings.max_batch_size, self.settings.cache_dir,
                                                        compile_missing=not self.settings.background)
            else:
                self._forwards[tree] = compiled_forward(self.model, self.kv_pool, self.capture_layers, tree,
                                                        max_position, self.settings.cache_dir)
        return self._forwards[tree]

    def warmup(self, batch_size: int, width: int, tree: bool = False, **model_inputs) -> None:
        """Compile the graph of `batch_size` requests of `width` tokens now, on inputs that touch only the
        pool's scratch row (one token in all is a graph of its own; all larger sizes share one)."""
        device = self.req_to_token.device
        with torch.inference_mode():  # as forwards run: inference tensors
            shape = (batch_size, width)
            named = dict(model_inputs)
            if tree:
                named["prefix_lens"] = torch.ones(batch_size, dtype=torch.int64, device=device)
                named["node_mask"] = torch.eye(width, dtype=torch.bool, device=device).expand(batch_size, width, width).contiguous()
            self.forward(tree)(torch.zeros(shape, dtype=torch.int64, device=device),
                               torch.arange(width, device=device).expand(shape).contiguous(),
                               torch.full(shape, -1, dtype=torch.int64, device=device),
                               torch.full((batch_size, width + 1), -1, dtype=torch.int64, device=device), **named)
