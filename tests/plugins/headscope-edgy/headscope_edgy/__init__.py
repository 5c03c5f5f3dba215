"""Entry points that are each wrong in one way (see pyproject.toml)."""

from pathlib import Path

import headscope as hs


def _previous(batch):
    content = batch.content
    rows, earlier = (content[:, 1:] & content[:, :-1]).nonzero(as_tuple=True)
    return rows, earlier + 1, earlier


def _divide(batch):
    return 1 / 0


# The built-in induction detector's role label: two "ind" roles would exist.
IND_TWIN = hs.TargetDetector("ind-twin", targets=_previous, role=hs.RoleSpec("ind", "another induction"))
# A prompt set that the package does not ship.
NO_PROMPTS = hs.TargetDetector(
    "no-prompts", targets=_previous, source=str(Path(__file__).parent / "missing.txt")
)
# Targets that raise: the error must name the detector and this package.
DIVIDES = hs.TargetDetector("divides", targets=_divide)


class Sweep(hs.Analysis):
    name = "sweep"
    summary = "not the real sweep"
    options = hs.Stats

    def run(self, loaded, options, prepared, progress):
        raise AssertionError("never runs")
