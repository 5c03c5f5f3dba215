"""TransformerLens' three named detection patterns, as functions of one prompt's token ids ``[T]``.

Each returns a ``[T, T]`` float pattern (query rows, key columns), lower triangular, with the
meaning TransformerLens' ``get_*_detection_pattern`` gives it. ``hs.detect(..., pattern=NAME)``
takes these names; any other function of the ids works the same way.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def previous_token_head(ids: torch.Tensor) -> torch.Tensor:
    """1 at (i, i - 1) for every i >= 1."""
    length = len(ids)
    pattern = torch.zeros(length, length)
    rows = torch.arange(1, length)
    pattern[rows, rows - 1] = 1.0
    return pattern


def duplicate_token_head(ids: torch.Tensor) -> torch.Tensor:
    """1 at (i, j) for every earlier j < i holding the same token id as i."""
    same = ids[:, None] == ids[None, :]
    return torch.tril(same, diagonal=-1).float()


def induction_head(ids: torch.Tensor) -> torch.Tensor:
    """1 at (i, j + 1) for every earlier j < i holding i's token, where j + 1 <= i."""
    duplicate = duplicate_token_head(ids)
    pattern = torch.zeros_like(duplicate)
    pattern[:, 1:] = duplicate[:, :-1]
    return torch.tril(pattern)


NAMED: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "previous_token_head": previous_token_head,
    "duplicate_token_head": duplicate_token_head,
    "induction_head": induction_head,
}
