"""One generation request and its life cycle: waiting -> running -> finished."""

import enum
import time
from dataclasses import dataclass, field

from eyas.engine.sampling_params import SamplingParams
from eyas.engine.spec_metrics import SpecCounters


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    seed_words: tuple[int, int] = (0, 0)  # key of the request's sampling noise (`keyed_random.seed_words`)
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    row: int | None = None  # row in the request-to-token table while running
    num_computed: int = 0  # tokens whose KV is committed
    prefilled: bool = False  # its worker has run its prefill since it was last admitted
    prefill_start: int = 0  # where its prefill began at its last admission (the end of its cached prefix)
    chunk_end: int | None = None  # a chunked prefill: this step computes positions up to here only, samples nothing
    num_cached_tokens: int | None = None  # prompt tokens found in the prefix cache at its first admission
    finish_reason: str | None = None  # "stop" | "length" | "error" | "abort"
    error: str | None = None
    stop_text_end: int | None = None  # text is cut here when a stop string matched
    num_forward_steps: int = 0
    num_preemptions: int = 0  # times its KV was taken back for an older request
    spec_counters: SpecCounters = field(default_factory=SpecCounters)
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    grammar: object | None = field(default=None, repr=False)  # its GrammarMatcher, for structured output
    sample_index: int = 0  # which of its prompt's `params.n` samples it is
    kv_copied_from: int | None = None  # the row whose prompt KV its last step copied (`shared_prefill`)
    logprobs: list | None = None  # TokenLogprob per output token, when params.logprobs is set
    new_logprobs: list | None = field(default=None, repr=False)  # the last step's, one per token it emitted

    def __post_init__(self):
        if self.params.logprobs is not None and self.logprobs is None:
            self.logprobs = []

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def step_ids(self) -> list[int]:
        """The tokens this step computes: past its committed KV, up to `chunk_end` when it prefills in chunks."""
        return self.all_ids[self.num_computed:self.chunk_end]

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def fail(self, message: str, finish_reason: str = "error") -> None:
        self.status = Status.FINISHED
        self.finish_reason = finish_reason
        self.error = message
        self.finish_time = time.perf_counter()
