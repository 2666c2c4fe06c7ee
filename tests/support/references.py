"""Plain computations the tests compare eyas's with: attention written out by hand, the filtered
sampling distribution and the penalised logits token by token, and the chi-square test of sampled counts."""

import torch

from eyas import SamplingParams


def naive_attention(q, keys, values, query_positions, scale):
    # q: [S, Hq, D]; keys/values: [L, Hkv, D]; query i sees keys 0..query_positions[i]
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    out = torch.empty_like(q)
    for i, pos in enumerate(query_positions):
        scores = torch.einsum("hd,lhd->hl", q[i], keys[:pos + 1]) * scale
        out[i] = torch.einsum("hl,lhd->hd", scores.softmax(-1), values[:pos + 1])
    return out


def reference_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
                    min_p: float = 0.0) -> torch.Tensor:
    """Independent restatement of temperature -> min-p -> top-k -> top-p, token by token."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    probs = torch.where(probs >= min_p * probs.max(), probs, 0.0)
    order = sorted((i for i in range(len(probs)) if probs[i] > 0), key=lambda i: -float(probs[i]))
    if top_k:
        order = order[:top_k]
    total = sum(float(probs[i]) for i in order)
    kept, mass = [], 0.0
    for i in order:
        if kept and mass >= top_p:
            break
        kept.append(i)
        mass += float(probs[i]) / total
    out = torch.zeros_like(probs)
    out[kept] = probs[kept]
    return out / out.sum()


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    n = counts.sum()
    support = probs > 0
    expected = probs[support] * n
    stat = ((counts[support] - expected) ** 2 / expected).sum()
    dof = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat.double() / 2))


def reference_processed(logits: torch.Tensor, params: SamplingParams, prompt: list[int],
                        output: list[int]) -> torch.Tensor:
    """One position's logits [V] after bias and penalties, token by token, with `output` the tokens before it."""
    out = logits.double().clone()
    for token, bias in params.logit_bias.items():
        out[token] += bias
    counts = {t: output.count(t) for t in set(output)}
    for token in set(prompt) | set(output):
        if params.repetition_penalty != 1:
            penalty = params.repetition_penalty
            out[token] = out[token] / penalty if out[token] > 0 else out[token] * penalty
    for token, count in counts.items():
        out[token] -= params.frequency_penalty * count + params.presence_penalty
    return out
