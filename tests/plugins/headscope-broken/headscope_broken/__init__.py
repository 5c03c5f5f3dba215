"""Deliberately broken entry points (see pyproject.toml)."""

import headscope as hs

FAKE_INDUCTION = hs.TargetDetector("induction", targets=lambda batch: ([], [], []))
NOT_A_DETECTOR = 42


class FakeScan(hs.Analysis):
    name = "scan"
    summary = "not the real scan"
    options = hs.Stats

    def run(self, loaded, options, prepared, progress):
        raise AssertionError("never runs")
