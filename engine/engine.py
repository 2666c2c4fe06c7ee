"""The engine: turns prompts into requests and steps schedule -> worker -> stop checks until all end."""

import time

import torch

from eyas.engine.errors import ConfigError
from eyas.engine.keyed_random import seed_words
from eyas.engine.metrics import EngineMetrics
from eyas.engine.outputs import RequestOutput
from eyas.engine.request import Request
from eyas.engine.sampling_params import SamplingParams
from eyas.engine.scheduler import Scheduler
from eyas.engine.stopping import StopChecker
from eyas.engine.tokenizer import Tokenizer


class Engine:
    def __init__(self, tokenizer: Tokenizer | None, scheduler: Scheduler, worker, stop_checker: StopChecker,
                 default_sampling: SamplingParams, seed: int, device: torch.device, warmup_graphs: bool = False,
                 vocab_size: int | None = None, grammars=None):
        """warmup_graphs: compile the worker's graphs now, for every batch size the scheduler may run.
        vocab_size: the target's; token ids a request names (logit_bias, stop_token_ids) are checked against it.
        grammars: the GrammarCompiler of requests with a `structured_output`."""
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.worker = worker
        self.stop_checker = stop_checker
        self.default_sampling = default_sampling
        self.device = torch.device(device)
        self.vocab_size = vocab_size
        self.grammars = grammars
        self._seeds = torch.Generator().manual_seed(seed)  # seeds of requests that bring none
        self._metrics = EngineMetrics()
        self._next_id = 0
        self.closed = False
        if warmup_graphs:
            self.worker.warmup_graphs(scheduler.max_running_requests)

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
        requests = self._make_requests(prompts, sampling, prompt_token_ids)
        for request in requests:
            self.scheduler.add(request)
        return requests

    def abort(self, requests: list[Request], reason: str = "aborted by the client") -> None:
        """End `requests` now (queued or running), freeing their KV; their finish_reason is "abort"."""
        self.scheduler.abort(requests, reason, finish_reason="abort")

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> None:
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
        return {**self._metrics.as_dict(), **self.scheduler.stats(), **self.worker.stats()}

    def close(self) -> None:
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _make_requests(self, prompts, sampling, prompt_token_ids) -> list[Request]:
        if (prompts is None) == (prompt_token_ids is None):
            raise ConfigError("generate() takes exactly one of `prompts` (text) or `prompt_token_ids`")
        if isinstance(prompts, str):
            prompts = [prompts]
        if prompts is not None and self.tokenizer is None:
            raise ConfigError("this model has no tokenizer.json: pass prompt_token_ids instead of text prompts")
        n = len(prompts) if prompts is not None else len(prompt_token_ids)
        params = sampling if isinstance(sampling, list) else [sampling or self.default_sampling] * n
        if len(params) != n:
            raise ConfigError(f"sampling: got {len(params)} SamplingParams for {n} prompts")
        for p in params:
            p.validate()
            if self.vocab_size is not None:
                p.check_vocabulary(self.vocab_size)
            if p.structured_output is not None:  # compiled now: a grammar that cannot compile runs nothing
                if self.grammars is None:
                    raise ConfigError("sampling.structured_output: this engine has no grammar compiler")
                self.grammars.check(p.structured_output)
        requests = []
        for i in range(n):
            p = params[i]
            ids = self.tokenizer.encode(prompts[i]) if prompts is not None else [int(t) for t in prompt_token_ids[i]]
            prompt = prompts[i] if prompts is not None else None
            for index in range(p.n):  # sample i of a seeded prompt takes seed + i
                seed = (p.seed + index) % 2**64 if p.seed is not None else \
                    int(torch.randint(0, 2**62, (1,), generator=self._seeds))
                grammar = None if p.structured_output is None else self.grammars.matcher(p.structured_output)
                requests.append(Request(self._next_id, ids, p, prompt=prompt, seed_words=seed_words(seed),
                                        sample_index=index, grammar=grammar))
                self._next_id += 1
        self._metrics.num_requests += len(requests)
        return requests

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
