"""The draft decode backend: one attention backend per draft step, so each step keeps its own metadata."""


class MultiStepDraftBackend:
    def __init__(self, backends: list):
        self.backends = backends

    @property
    def num_steps(self) -> int:
        return len(self.backends)

    def backend_for_step(self, step: int):
        return self.backends[step]
