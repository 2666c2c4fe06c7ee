"""Grammar masks on a draft head's logits: a request with a grammar drafts what its grammar allows.

The head scores its own vocabulary and the grammar masks the target's, so each mask is read at the
target ids of the draft's columns (`draft_token_ids`, [Vd]). A row or node whose allowed tokens the
draft vocabulary lacks is left unmasked and drafts freely. A chain masks each step after the drafts
before it (one `DraftWalk` per request); a tree masks each frontier node after its own path
(`GrammarMatcher.masks_after`).
"""

import torch


def mask_chain_step(logits: torch.Tensor, walks: dict, draft_token_ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The draft's logits [B, Vd] with what each walk's grammar disallows next at -inf (over the
    draft vocabulary's target ids); and each walk's mask over the target vocabulary (None: unmasked)."""
    allowed = {row: walk.mask() for row, walk in walks.items()}
    keep = torch.ones(logits.shape, dtype=torch.bool, device=logits.device)
    for row, mask in allowed.items():
        if mask is not None:
            on_draft = mask.to(logits.device)[draft_token_ids[:logits.shape[-1]]]
            if bool(on_draft.any()):  # a draft vocabulary with none of the allowed tokens drafts freely
                keep[row] = on_draft
    return logits.masked_fill(~keep, float("-inf")), allowed


def mask_tree_nodes(logits: torch.Tensor, grammar, paths: dict[int, list[list[int]]],
                    draft_token_ids: torch.Tensor) -> torch.Tensor:
    """logits [B * w, Vd] of w tree nodes per request, with what each grammar row's request allows after
    each node's path (paths: row -> w paths of target ids) at -inf, over the draft vocabulary."""
    width = logits.shape[0] // grammar.size
    keep = torch.ones(logits.shape, dtype=torch.bool, device=logits.device)
    ids = draft_token_ids[:logits.shape[-1]]
    for row, matcher in zip(grammar.rows, grammar.grammars):
        on_draft = matcher.masks_after(paths[row]).to(logits.device)[:, ids]  # [w, Vd]
        allows = on_draft.any(dim=-1, keepdim=True)  # a node whose allowed tokens the draft lacks drafts freely
        keep[row * width:(row + 1) * width] = on_draft | ~allows
    return logits.masked_fill(~keep, float("-inf"))
