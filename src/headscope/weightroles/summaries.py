"""The weights tables' summaries and roles: declared in :mod:`headscope.core.weighttables` (a leaf, so
that detectors, a sibling layer, can check role labels against them); re-exported here."""

from headscope.core.weighttables import DETECTOR, ROLES, SUMMARIES

__all__ = ["DETECTOR", "ROLES", "SUMMARIES"]
