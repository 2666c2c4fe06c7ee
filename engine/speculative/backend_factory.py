"""DraftBackendFactory: the draft model's attention backends, built by name from the attention config."""

from eyas.engine.attention.multi_step import MultiStepDraftBackend

ATTENTION_MODES = ("prefill", "decode")  # speculative.attention_mode: how the draft steps attend


class DraftBackendFactory:
    def __init__(self, backend_classes: dict[str, type], head_dim: int, num_steps: int,
                 attention_mode: str, prefill_backend: str, decode_backend: str,
                 draft_attention_backend: str | None = None):
        self.backend_classes = backend_classes
        self.head_dim = head_dim
        self.num_steps = num_steps
        self.attention_mode = attention_mode
        self.prefill_backend = prefill_backend
        self.decode_backend = decode_backend
        self.draft_attention_backend = draft_attention_backend

    def _build(self, name: str):
        return self.backend_classes[name](self.head_dim)

    def create_decode_backend(self) -> MultiStepDraftBackend | None:
        """One backend per draft forward step (`num_steps - 1` of them: the first proposal comes from
        draft-extend); None when `num_steps <= 1`."""
        if self.num_steps <= 1:
            return None
        return MultiStepDraftBackend([self._build(self.decode_backend) for _ in range(self.num_steps - 1)])

    def create_draft_extend_backend(self):
        """The backend of the draft-extend forward: `speculative.draft_attention_backend` when set, else
        the backend of `speculative.attention_mode`. None when that backend cannot run an extend (the
        draft runner then keeps its own)."""
        name = self.draft_attention_backend or (
            self.prefill_backend if self.attention_mode == "prefill" else self.decode_backend)
        cls = self.backend_classes[name]
        if not getattr(cls, "supports_extend", True):
            return None
        return self._build(name)
