"""The engine: queues the requests its `RequestBuilder` makes of prompts, steps schedule -> worker -> stop checks
until all end, and turns each finished request into its `RequestOutput`."""

import time

import torch

from eyas.engine.graphs.background import BackgroundGraphs
from eyas.engine.metrics import EngineMetrics
from eyas.engine.outputs import RequestOutput
from eyas.engine.request import Request
from eyas.engine.request_builder import RequestBuilder
from eyas.engine.sampling_params import SamplingParams
from eyas.engine.scheduler import Scheduler
from eyas.engine.stopping import StopChecker
from eyas.engine.tokenizer import Tokenizer


class Engine:
    def __init__(self, tokenizer: Tokenizer | None, scheduler: Scheduler, worker, stop_checker: StopChecker,
                 requests: RequestBuilder, device: torch.device, warmup_graphs: bool = False,
                 graphs: BackgroundGraphs | None = None):
        """requests: turns prompts into checked requests. warmup_graphs: compile the worker's graphs now,
        for every batch size the scheduler may run. graphs: graph runners compiled in the background and
        swapped in at a step boundary (`graphs.mode=auto`)."""
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.worker = worker
        self.stop_checker = stop_checker
        self.requests = requests
        self.device = torch.device(device)
        self._metrics = EngineMetrics()
        self.closed = False
        if warmup_graphs:
            self.worker.warmup_graphs(scheduler.max_running_requests)
        self.graphs = graphs
        if graphs is not None:
            graphs.start()

    @property
    def grammars(self):
        """The GrammarCompiler of requests with a `structured_output` (None: the engine has none)."""
        return self.requests.grammars

    def generate(self, prompts: str | list[str] | None = None,
                 sampling: SamplingParams | list[SamplingParams] | None = None,
                 prompt_token_ids: list[list[int]] | None = None) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs come back in the prompts' order (a
        prompt's `n` samples together, by `index`)."""
        start = time.perf_counter()
        requests = self.submit(prompts, sampling, prompt_token_ids)
        try:
            while self.scheduler.has_work():
                self.step()
        except BaseException as e:  # an error or an interrupt mid-step: leave no request running and no KV held
            self.scheduler.abort(requests, f"generate() stopped by {type(e).__name__}: {e}", cache=False)
            raise
        self._metrics.generate_time_s += time.perf_counter() - start
        return [self.output(r) for r in requests]

    def submit(self, prompts: str | list[str] | None = None,
               sampling: SamplingParams | list[SamplingParams] | None = None,
               prompt_token_ids: list[list[int]] | None = None) -> list[Request]:
        """Queue requests without running them; `step` advances every queued and running request.
        A request that cannot be served comes back already finished with the reason."""
        if self.closed:
            raise RuntimeError("engine is closed")
        requests = self.requests.build(prompts, sampling, prompt_token_ids)
        self._metrics.num_requests += len(requests)
        for request in requests:
            self.scheduler.add(request)
        return requests

    def abort(self, requests: list[Request], reason: str = "aborted by the client") -> None:
        """End `requests` now (queued or running), freeing their KV; their finish_reason is "abort"."""
        self.scheduler.abort(requests, reason, finish_reason="abort")

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> None:
        if self.graphs is not None:
            self.graphs.poll()  # runners swap in here, between steps
        running = self.scheduler.schedule()
        new_tokens = self.worker.step(running)
        for request, tokens in zip(running, new_tokens):
            request.num_forward_steps += 1
            appended = 0
            for token in tokens:
                appended += 1
                if self.stop_checker.append(request, token):
                    break
            if request.logprobs is not None and request.new_logprobs is not None:
                request.logprobs.extend(request.new_logprobs[:appended])
        self._metrics.forward_steps += 1
        self.scheduler.cache_progress()
        self.scheduler.release_finished()

    def metrics(self) -> dict:
        graphs = self.graphs.stats() if self.graphs is not None else {}
        return {**self._metrics.as_dict(), **self.scheduler.stats(), **self.worker.stats(), **graphs}

    def close(self) -> None:
        self.closed = True
        if self.graphs is not None:
            self.graphs.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def output(self, request: Request) -> RequestOutput:
        """The result of a finished request (counted once in `metrics`)."""
        text = self.tokenizer.decode(request.output_ids) if self.tokenizer is not None else ""
        if request.stop_text_end is not None:
            text = text[:request.stop_text_end]
        if request.finish_reason == "error":
            self._metrics.num_failed += 1
        elif request.finish_reason == "abort":
            self._metrics.num_aborted += 1
        else:
            self._metrics.num_finished += 1
            self._metrics.prompt_tokens += len(request.prompt_ids)
            self._metrics.generated_tokens += len(request.output_ids)
        return RequestOutput(request.request_id, request.prompt, request.prompt_ids, text, list(request.output_ids),
                             request.finish_reason, request.error, self._stats(request), request.sample_index,
                             None if request.logprobs is None else list(request.logprobs))

    @staticmethod
    def _stats(request: Request) -> dict:
        latency = (request.finish_time or request.arrival_time) - request.arrival_time
        stats = {
            "prompt_tokens": len(request.prompt_ids),
            "cached_tokens": request.num_cached_tokens or 0,  # prompt tokens whose KV came from the prefix cache
            "generated_tokens": len(request.output_ids),
            "forward_steps": request.num_forward_steps,
            "latency_s": latency,
        }
        if request.first_token_time is not None:
            stats["time_to_first_token_s"] = request.first_token_time - request.arrival_time
        if request.spec_counters.num_verify_cycles:
            stats.update(request.spec_counters.as_dict())
        return stats
