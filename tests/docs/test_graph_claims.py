"""What docs/analyses/graph.md says about SmolLM2's IOI graph holds for the output generated beside
it (make docs-outputs regenerates that block; this reads the committed text, no model)."""

from __future__ import annotations

import re

from conftest import ROOT
from docs_script import load_script


def _heads() -> dict[str, tuple[float, dict[str, list[str]]]]:
    docs = load_script()
    (block,) = [b for b in docs.parse(ROOT / "docs/analyses/graph.md").blocks if b.id == "graph-ioi"]
    text = "\n".join(block.body)
    found = {}
    for match in re.finditer(
        r"^(L\d+H\d+) \(contrast ([+-][\d.]+) per prompt[^\n]*\n((?:  ← [^\n]*\n)+)", text, re.M
    ):
        sides = {}
        for line in match[3].splitlines():
            side, _, rest = line.strip().removeprefix("← ").partition(" from")
            sides[side] = re.findall(r"(L\d+H\d+|mlp\d+|embed|bias) \d", rest)
        found[match[1]] = (float(match[2]), sides)
    return found


def test_the_name_movers_take_their_queries_from_the_s_inhibition_heads():
    heads = _heads()
    movers, inhibitors = ["L23H0", "L23H1", "L23H2", "L23H7"], ["L19H2", "L20H0"]
    assert set(movers + inhibitors) <= set(heads), sorted(heads)
    for name in movers:
        contrast, sides = heads[name]
        assert contrast > 0  # the indirect object preferred
        assert sides["queries"][:2] == ["L20H0", "L19H2"] or sides["queries"][0] == "L20H0", sides
        assert sides["values"][0] == "mlp0"
    for name in inhibitors:
        assert heads[name][0] < 0  # the subject preferred
    assert "L17H4" in heads["L20H0"][1]["values"]
