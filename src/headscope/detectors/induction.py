"""Heads defined by token identity: duplicate-token and induction (prefix matching).

Both are declared (:class:`~headscope.detectors.target.TargetDetector`): the attention mass on
target keys against the uniform share of those keys. Only the targets differ.
"""

from __future__ import annotations

from headscope.capture import Batch
from headscope.core.rolespec import RoleSpec

from .target import TargetDetector, Targets


def duplicate_targets(batch: Batch) -> Targets:
    """(rows, queries, keys): every earlier occurrence k of query q's (non-special) token."""
    return batch.earlier_same_token_pairs


def induction_targets(batch: Batch) -> Targets:
    """(rows, queries, keys) with k = j+1 for every earlier occurrence j of query q's token, k < q.

    This is prefix matching: in "A B ... A", the second A should look at B.
    """
    if "induction_targets" not in batch._cache:
        rows, queries, earlier = batch.earlier_same_token_pairs
        keys = earlier + 1
        keep = keys < queries
        rows, queries, keys = rows[keep], queries[keep], keys[keep]
        keep = batch.content[rows, keys]
        batch._cache["induction_targets"] = (rows[keep], queries[keep], keys[keep])  # type: ignore[assignment]
    return batch._cache["induction_targets"]  # type: ignore[return-value]


DuplicateTokenDetector = TargetDetector(
    "duplicate-token",
    targets=duplicate_targets,
    summary="attention from a token to its earlier occurrences, summed, over tokens seen before",
    source="repeated-tokens",
    role=RoleSpec(
        "dup", "duplicate-token", "#da77f2", "magenta", data="repeated random tokens", verify="later-copies"
    ),
)

InductionDetector = TargetDetector(
    "induction",
    targets=induction_targets,
    summary="attention from a repeated token to the tokens that followed its earlier occurrences",
    source="repeated-tokens",
    role=RoleSpec(
        "ind", "induction", "#f03e3e", "bold red", data="repeated random tokens", verify="later-copies"
    ),
)
