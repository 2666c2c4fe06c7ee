"""ModelRunner: one model forward for a batch, with the attention backend bound to this runner."""

from dataclasses import dataclass

import torch

from eyas.engine.cache.kv_pool import PagedKVPool
from eyas.engine.forward_batch import ForwardBatch
from eyas.engine.models.row_invariance import exact_rows


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [M, V] float32, rows chosen by `logits_indices`
    hidden: torch.Tensor  # [N, H] final hidden state of every new token
    aux_hidden: list[torch.Tensor]  # per aux layer: [N, H]

    def of_requests(self, extend_lens: list[int], rows: list[int]) -> "ForwardOutput":
        """The output of a forward over requests with `extend_lens` new tokens each (one logits row each),
        for the requests `rows` index, in that order (repeats allowed)."""
        starts = [0]
        for n in extend_lens[:-1]:
            starts.append(starts[-1] + n)
        tokens = torch.cat([torch.arange(starts[k], starts[k] + extend_lens[k]) for k in rows]).to(self.hidden.device)
        rows_t = torch.tensor(rows, device=self.logits.device)
        return ForwardOutput(self.logits[rows_t], self.hidden[tokens], [a[tokens] for a in self.aux_hidden])


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_pool: PagedKVPool, attn_backend, capture_layers: tuple[int, ...] = ()):
        self.model = model
        self.kv_pool = kv_pool
        self.attn_backend = attn_backend
        # target layers whose input every forward returns (`aux_hidden`): an EAGLE-3 head's features
        self.capture_layers = tuple(capture_layers)

    @property
    def device(self) -> torch.device:
        return next(p for p in self.model.parameters() if not p.is_meta).device  # quantized layers release theirs

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, logits_indices: torch.Tensor | None = None, attn_backend=None,
                graph=None, **model_inputs) -> ForwardOutput:
        """Run the model over `batch`; logits for `logits_indices` (default: each request's last token).

        The forward runs as `graph` (a `GraphRunner` of this model) when one is passed and the batch
        fits it (and is not `exact`: see `ForwardBatch.exact`); else eagerly on `self.attn_backend`, or on the backend passed (the draft decode steps
        pass their per-step backend; everything else uses the bound one)."""
        with exact_rows(batch.exact):
            if graph is not None and graph.fits(batch) and not batch.exact:
                hidden, aux = graph.run(batch, **model_inputs)
            else:
                hidden, aux = self._eager(batch, attn_backend, model_inputs)
            if logits_indices is not None:
                last = hidden[logits_indices]
            elif hidden.shape[0] == batch.batch_size:  # one new token per request: every row is a last row
                last = hidden
            else:
                last = hidden[batch.last_token_indices]
            return ForwardOutput(self.model.compute_logits(last), hidden, aux)

    def _eager(self, batch: ForwardBatch, attn_backend, model_inputs: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
        backend = self.attn_backend if attn_backend is None else attn_backend
        batch.kv_pool = self.kv_pool
        batch.attn_backend = backend
        backend.init_forward_metadata(batch)
        if self.capture_layers:
            model_inputs["aux_layer_ids"] = self.capture_layers
        return self.model(batch.input_ids, batch.positions, batch, **model_inputs)
