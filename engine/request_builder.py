"""Prompts -> Requests: what a request asks for is checked before anything runs (its sampling settings,
token ids against the vocabulary, its grammar compiled), then each prompt is tokenized and each of its `n`
samples gets an id, a seed (sample i of a seeded prompt takes seed + i; an unseeded one draws from the
engine's own seed) and a grammar matcher of its own."""

import torch

from eyas.engine.errors import ConfigError
from eyas.engine.keyed_random import seed_words
from eyas.engine.request import Request
from eyas.engine.sampling_params import SamplingParams
from eyas.engine.tokenizer import Tokenizer


class RequestBuilder:
    def __init__(self, tokenizer: Tokenizer | None, default_sampling: SamplingParams, seed: int,
                 vocab_size: int | None = None, grammars=None):
        """vocab_size: the target's; token ids a request names (logit_bias, stop_token_ids) are checked against it.
        grammars: the GrammarCompiler of requests with a `structured_output`."""
        self.tokenizer = tokenizer
        self.default_sampling = default_sampling
        self.vocab_size = vocab_size
        self.grammars = grammars
        self._seeds = torch.Generator().manual_seed(seed)  # seeds of requests that bring none
        self._next_id = 0

    def build(self, prompts: str | list[str] | None, sampling: SamplingParams | list[SamplingParams] | None,
              prompt_token_ids: list[list[int]] | None) -> list[Request]:
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
            self._check(p)
        requests = []
        for i in range(n):
            p = params[i]
            ids = self.tokenizer.encode(prompts[i]) if prompts is not None else [int(t) for t in prompt_token_ids[i]]
            prompt = prompts[i] if prompts is not None else None
            for index in range(p.n):
                seed = seed_words(self._seed(p, index))
                requests.append(Request(self._next_id, ids, p, prompt=prompt, seed_words=seed, sample_index=index,
                                        grammar=self._matcher(p)))
                self._next_id += 1
        return requests

    def _check(self, params: SamplingParams) -> None:
        params.validate()
        if self.vocab_size is not None:
            params.check_vocabulary(self.vocab_size)
        if params.structured_output is not None:  # compiled now: a grammar that cannot compile runs nothing
            if self.grammars is None:
                raise ConfigError("sampling.structured_output: this engine has no grammar compiler")
            self.grammars.check(params.structured_output)

    def _seed(self, params: SamplingParams, index: int) -> int:
        if params.seed is not None:
            return (params.seed + index) % 2**64
        return int(torch.randint(0, 2**62, (1,), generator=self._seeds))

    def _matcher(self, params: SamplingParams):
        return None if params.structured_output is None else self.grammars.matcher(params.structured_output)
