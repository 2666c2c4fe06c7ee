"""Log-probabilities of chosen tokens, for requests that ask (`SamplingParams.logprobs`).

A token's log-probability is log_softmax(processed logits / T) at its position: the logits after logit
bias and penalties (`logits_processing`), T the request's temperature (1 for greedy), before a
grammar's mask, min-p, top-k and top-p (what the model and the request's bias and penalties give the
token, whatever the grammar forces); the alternatives are the `logprobs` best tokens there, best first. Under speculation
the verify forward's row of the node a token was chosen at gives it, so it is plain decoding's.
"""

from dataclasses import dataclass

import torch


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, log-probability) of the best alternatives, best first


def record(requests, logits: torch.Tensor, rows: list[list[int]], tokens: list[list[int]]) -> None:
    """Set `new_logprobs` of every request that asks for them: request i's token tokens[i][j] was chosen
    from logits row rows[i][j] (logits: [R, V], processed)."""
    wanted = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
    for r in requests:
        r.new_logprobs = None
    if not wanted:
        return
    flat_rows = [row for i in wanted for row in rows[i]]
    flat_tokens = [t for i in wanted for t in tokens[i]]
    temperature = [1.0 if requests[i].params.greedy else requests[i].params.temperature for i in wanted for _ in rows[i]]
    device = logits.device
    index = torch.tensor(flat_rows, dtype=torch.int64, device=device)
    scaled = logits[index].float() / torch.tensor(temperature, device=device)[:, None]
    logprobs = scaled.log_softmax(dim=-1)
    chosen = logprobs.gather(1, torch.tensor(flat_tokens, dtype=torch.int64, device=device)[:, None])[:, 0]
    width = max(requests[i].params.logprobs for i in wanted)
    top = logprobs.topk(width, dim=-1) if width else None
    chosen = chosen.tolist()
    top_values, top_ids = (top.values.tolist(), top.indices.tolist()) if top is not None else ([], [])
    k = 0
    for i in wanted:
        n = requests[i].params.logprobs
        entries = []
        for token in tokens[i]:
            alternatives = list(zip(top_ids[k][:n], top_values[k][:n])) if n else []
            entries.append(TokenLogprob(token, chosen[k], alternatives))
            k += 1
        requests[i].new_logprobs = entries
