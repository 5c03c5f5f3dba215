"""The loss on each copy of the repeated-random-tokens sequences, measured during a forward pass.

``induction`` reports it (how much the later copies gain from in-context copying) and the ablation
engine measures it with heads ablated; both import it from here.
"""

from __future__ import annotations

import torch

from headscope import capture

from .base import CopyLoss


class CopyLossMeter:
    """Accumulates next-token loss by copy index from each batch's [B, T-1] token losses.

    Also keeps, per example, the loss summed over the later copies and its token count, so that
    the later-copy loss can be bootstrapped over sequences.
    """

    def __init__(self, offset: int, seq_len: int, repeats: int, n_examples: int) -> None:
        self.offset, self.seq_len, self.repeats = offset, seq_len, repeats
        self.loss_sum = torch.zeros(repeats, dtype=torch.float64)
        self.tokens = torch.zeros(repeats, dtype=torch.long)
        self.later_sum = torch.zeros(n_examples, dtype=torch.float64)
        self.later_tokens = torch.zeros(n_examples, dtype=torch.float64)

    def __call__(self, token_losses: torch.Tensor, batch: capture.Batch) -> None:
        losses = token_losses.cpu()  # [B, T-1]: loss of predicting token t+1
        positions = torch.arange(1, batch.input_ids.shape[1])
        copy_index = (positions - self.offset).div(self.seq_len, rounding_mode="floor")
        in_body = (positions >= self.offset) & (copy_index < self.repeats)
        for copy in range(self.repeats):
            mask = in_body & (copy_index == copy)
            self.loss_sum[copy] += losses[:, mask].double().sum()
            self.tokens[copy] += int(mask.sum()) * losses.shape[0]
        later = in_body & (copy_index >= 1)
        rows = batch.example_index
        self.later_sum[rows] += losses[:, later].double().sum(1)
        self.later_tokens[rows] += float(later.sum())

    def result(self) -> CopyLoss:
        per_copy = (self.loss_sum / self.tokens.clamp(min=1)).tolist()
        return CopyLoss(per_copy, self.tokens.tolist())
