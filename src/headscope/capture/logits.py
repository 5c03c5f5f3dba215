"""The model's LM head, without ``[B, T, vocab]`` logits: logits at a few positions or of a few
tokens, and each position's next-token loss (the head a vocabulary slice at a time, a running
log-sum-exp folding the slices in). Both :mod:`headscope.capture.stream` (the passes' losses) and
:mod:`headscope.capture.ledger` (pricing the head into a bare forward) use it."""

from __future__ import annotations

from typing import Any

import torch

_LOGIT_CHUNK_ELEMENTS = 1 << 21  # logits held at once by next_token_losses (8 MB in float32)


def output_logits(loaded: Any, hidden: torch.Tensor) -> torch.Tensor:
    """float32 logits of final hidden states ``[..., D]``: the model's LM head, then Gemma's final
    logit soft-capping where the config sets it (as ``model(...).logits`` computes them)."""
    return _soft_capped(loaded, loaded.model.get_output_embeddings()(hidden).float())


def _soft_capped(loaded: Any, logits: torch.Tensor) -> torch.Tensor:
    """float32 ``logits`` after Gemma's final logit soft-capping, in place, where the config sets it."""
    softcap = getattr(loaded.model.config, "final_logit_softcapping", None)
    if softcap is not None:
        logits = torch.tanh(logits.div_(softcap)).mul_(softcap)
    return logits


def output_logits_of(loaded: Any, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """float32 logits ``[B, K]`` of ``tokens`` ``[B, K]`` only, from final hidden states ``[B, D]``:
    :func:`output_logits` at those tokens (to float noise), without the whole vocabulary's. An LM head
    that is not a plain ``Linear`` runs whole."""
    head = loaded.model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        logits = output_logits(loaded, hidden)
        return logits.gather(-1, tokens.to(logits.device))
    ids = tokens.to(head.weight.device)
    weight = head.weight[ids]  # [B, K, D]
    logits = torch.einsum("bd,bkd->bk", hidden.to(weight.dtype), weight)
    if head.bias is not None:
        logits = logits + head.bias[ids]
    return _soft_capped(loaded, logits.float())


def next_token_losses(loaded: Any, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, T-1] cross-entropy of token t+1 given positions <= t, from final hidden states [B, T, D].

    The model's own LM head (and Gemma's final logit soft-capping, where the config sets it), the
    same computation as ``model(...).logits``, without ever holding ``[B, T, vocab]`` logits. A plain
    ``Linear`` head runs a slice of the vocabulary at a time over a block of positions, and a running
    log-sum-exp folds each slice in: the slice's logits stay in cache and the head's weight is read
    once per block, not once per few positions (on Gemma 3's 262,144-token head, half the time of
    position chunks). Each target's logit is its own row of the head. Any other head runs whole, a
    few positions at a time.
    """
    batch, length, width = hidden.shape
    if length < 2:
        return torch.empty(batch, 0, dtype=torch.float32, device=hidden.device)
    head = loaded.model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        return _losses_by_positions(loaded, hidden, input_ids)
    states = hidden[:, :-1].reshape(-1, width).to(head.weight.dtype)
    targets = input_ids[:, 1:].reshape(-1).to(head.weight.device)
    vocab = head.weight.shape[0]
    out = torch.empty(states.shape[0], dtype=torch.float32, device=hidden.device)
    for start in range(0, states.shape[0], _LOSS_BLOCK):
        block = states[start : start + _LOSS_BLOCK]
        step = max(_LOSS_MIN_SLICE, _LOGIT_CHUNK_ELEMENTS // block.shape[0])
        total = None
        for v0 in range(0, vocab, step):
            bias = None if head.bias is None else head.bias[v0 : v0 + step]
            logits = torch.nn.functional.linear(block, head.weight[v0 : v0 + step], bias)
            logits = _soft_capped(loaded, logits.float())
            part = torch.logsumexp(logits, dim=-1)
            total = part if total is None else torch.logaddexp(total, part)
            del logits
        picked = output_logits_of(loaded, block, targets[start : start + _LOSS_BLOCK, None])[:, 0]
        out[start : start + block.shape[0]] = total - picked
    return out.view(batch, length - 1)


_LOSS_BLOCK = 4096  # positions per block of the vocabulary-sliced head
_LOSS_MIN_SLICE = 256  # vocabulary rows per slice, at least


def _losses_by_positions(loaded: Any, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """:func:`next_token_losses` for a head that is not a plain ``Linear``: whole, in position chunks."""
    batch, length, _ = hidden.shape
    vocab = loaded.model.get_output_embeddings().weight.shape[0]
    chunk = max(1, _LOGIT_CHUNK_ELEMENTS // max(1, batch * vocab))
    out = torch.empty(batch, length - 1, dtype=torch.float32, device=hidden.device)
    for start in range(0, length - 1, chunk):
        stop = min(length - 1, start + chunk)
        logits = output_logits(loaded, hidden[:, start:stop])
        targets = input_ids[:, start + 1 : stop + 1]
        picked = logits.gather(-1, targets[..., None])[..., 0]
        out[:, start:stop] = torch.logsumexp(logits, dim=-1) - picked
        del logits
    return out
