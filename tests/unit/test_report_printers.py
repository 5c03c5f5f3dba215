"""The terminal report prints each table the way its detector (or its analysis) declares, and
headscope.outputs branches on no detector or analysis name.

A synthetic report with a table of every kind (token-level, syntax's grouped tables, coreference,
retrieval, the weights tables, IOI, function vectors, an undeclared one) pins the headings, captions,
legends, compare names and the HTML report's signed axes, as they were printed before the
presentation moved into the declarations (Detector.heading / caption / grouped / relation_names /
short_name, RoleSpec.kind, and the weights outcome's own caption).
"""

from __future__ import annotations

import ast
import io
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
from rich.console import Console

from headscope import detectors
from headscope.analyses import ANALYSES
from headscope.analyses.weights import TaskCount, WeightOutcome
from headscope.extend.base import Report, Section
from headscope.outputs import report as printing
from headscope.outputs import report_data

OUTPUTS = Path(__file__).resolve().parents[2] / "src" / "headscope" / "outputs"


def _section(detector, relation="", direction="", data="d", **fields):
    values = {
        "summary": f"{detector} summary",
        "description": f"{data} text",
        "n": 120,
        "n_examples": 12,
        "baseline": 0.25,
        "baseline_kind": "uniform",
        "baseline_label": "",
        **fields,
    }
    return Section(
        detector, relation, direction, values.pop("summary"), data, values.pop("description"), **values
    )


SECTIONS = [
    _section("previous-token", data="natural-text", baseline_range=(0.1, 0.3)),
    _section(
        "syntax", "nsubj", "dep->head", "syntax-en", baseline_kind="positional", baseline_label="offset -1"
    ),
    _section(
        "syntax", "nsubj", "head->dep", "syntax-en", baseline_kind="positional", baseline_label="first word"
    ),
    _section(
        "syntax", "obj", "dep->head", "syntax-en", baseline_kind="positional", baseline_label="offset +2"
    ),
    _section(
        "syntax", "clf", "dep->head", "syntax-zh", baseline_kind="positional", baseline_label="offset 1"
    ),
    _section(
        "coref",
        "coref",
        "pronoun->antecedent",
        "coref-en",
        baseline_kind="nearest-candidate",
        extras={"chance": 0.31, "first candidate": 0.42},
    ),
    _section(
        "coref",
        "coref",
        "pronoun->antecedent",
        "coref-zh",
        baseline_kind="nearest-candidate",
        extras={"chance": 0.5},
    ),
    _section("retrieval", data="haystack-a"),
    _section("weights", "copying", data="vocab", baseline=0.00012),
    _section("weights", "eigenvalue", data="vocab", baseline=None),
    _section("weights", "successor", data="ordinal-en", baseline=1 / 7),
    _section("ioi", "dla", "io-s", "ioi-en"),
    _section("fv", "aie", "", "fv-tasks"),
    _section("mine", "rel", "dir", "own"),
]


def _report() -> Report:
    rows = [
        {
            "model": "m",
            "detector": s.detector,
            "relation": s.relation,
            "direction": s.direction,
            "layer": layer,
            "head": head,
            "kv_group": head,
            "score": 0.1 + 0.2 * layer + 0.05 * head,
            "baseline": s.baseline,
            "ci_low": 0.05,
            "ci_high": 0.6,
            "n": s.n,
            "rank": 4 - 2 * layer - head,
            "role": "",
            "data": s.data,
        }
        for s in SECTIONS
        for layer in range(2)
        for head in range(2)
    ]
    tasks = [
        TaskCount("ordinal-en", "days", "f", 7, 7, 6),
        TaskCount("ordinal-en", "months", "f", 5, 12, 4),
        TaskCount("ordinal-en", "none", "f", 0, 3, 0),
        TaskCount("ordinal-zh", "zh", "f", 3, 7, 2),
    ]
    outcome = WeightOutcome("mlp0", 10, 100, 1000, 0, tasks=tasks)
    return Report("m", pd.DataFrame(rows), SECTIONS, "stream", outcomes={"vocab": outcome})


def _printed(draw) -> list[str]:
    buffer = io.StringIO()
    draw(Console(file=buffer, width=400, no_color=True, highlight=False, color_system=None))
    return buffer.getvalue().splitlines()


def test_each_table_prints_as_its_declaration_says():
    lines = _printed(lambda console: printing.print_report(_report(), console, top=3))
    expected = [
        "previous-token: previous-token summary",
        "data: natural-text text; n = 120 positions in 12 examples; uniform-attention baseline = "
        "0.100–0.300 by layer (each layer's mask); CI: 95% bootstrap over examples",
        "syntax · syntax-en: syntax summary",
        "nsubj = subject–verb (主谓); obj = verb–object (动宾)",
        "data: syntax-en text; baseline: best positional rule (always the word k positions away, or always "
        "the first word); CI: 95% bootstrap over sentences",
        "syntax · syntax-zh: syntax summary",
        "clf = classifier–noun (量词)",
        "coreference · coref-en · pronoun → antecedent (指代): coref summary",
        "data: coref-en text; n = 120 examples; nearest-candidate baseline = 0.250; chance = 0.310; "
        "first-candidate = 0.420; CI: 95% bootstrap over examples",
        "data: coref-zh text; n = 120 examples; nearest-candidate baseline = 0.250; chance = 0.500; "
        "first-candidate = –; CI: 95% bootstrap over examples",
        "retrieval · haystack-a: retrieval summary",
        "weights · copying: weights summary",
        "data: vocab text; n = 120 tokens; baseline = k / vocabulary = 1.20e-04; CI: 95% bootstrap over tokens",
        "data: vocab text; score in [-1, 1], 0 for a random matrix; computed once on the sampled tokens' "
        "circuit (no interval, no role: the token tests decide)",
        "data: ordinal-en text; single-token members: days 7/7, months 5/12; n = 120 pairs; chance baseline "
        "= 0.143 (1 / task size); CI: 95% bootstrap over pairs",
        "ioi · dla · io-s: ioi summary",
        "fv · aie: fv summary",
        "mine · rel · dir: mine summary",
        "data: own text; n = 120 positions in 12 examples; uniform-attention baseline = 0.250; CI: 95% "
        "bootstrap over examples",
    ]
    for line in expected:
        assert line in lines, line
    # syntax's tables of one treebank print as one table: its heading once per treebank
    assert sum(line.startswith("syntax · ") for line in lines) == 2


def test_compare_names_each_table_by_its_detectors_short_name():
    def change(detector, relation="", direction="", data=""):
        return SimpleNamespace(
            detector=detector,
            relation=relation,
            direction=direction,
            data=data,
            n_common=4,
            biggest_rise=(0, 1, 0.2),
            biggest_fall=None,
            gained=[],
            lost=[],
            best_a=(0, 0, 0.5),
            best_b=(1, 1, 0.6),
            mean_delta=0.01,
            correlation=0.9,
        )

    tables = [
        change("syntax", "nsubj", "dep->head", "syntax-en"),
        change("coref", "coref", "pronoun->antecedent", "coref-zh"),
        change("coref"),
        change("previous-token"),
        change("duplicate-token"),
        change("retrieval", data="h"),
    ]
    names = [printing.table_name(t) for t in tables]
    assert names == ["syntax-en nsubj dep->head", "coref-zh", "coref", "prev-token", "dup-token", "retrieval"]


def test_signed_scores_draw_on_a_signed_axis_by_their_role_kind():
    report = _report()
    sections = [{k: getattr(s, k) for k in ("data", "detector", "relation", "direction")} for s in SECTIONS]
    signed = {t["title"] for t in report_data._tables(report.table, sections) if t["signed"]}
    assert signed == {"ioi-en · ioi · dla · io-s", "fv-tasks · fv · aie"}


def _names_compared(path: Path, names: set[str]) -> list[str]:
    """String constants of ``names`` that ``path`` compares with (==, in) or lists in a literal set."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
        elif isinstance(node, ast.Set):
            parts = [e for elt in node.elts for e in (elt.elts if isinstance(elt, ast.Tuple) else [elt])]
        else:
            continue
        found += [
            f"{path.name}:{p.lineno} {p.value!r}"
            for p in parts
            if isinstance(p, ast.Constant) and isinstance(p.value, str) and p.value in names
        ]
    return found


def test_outputs_branch_on_no_detector_or_analysis_name():
    names = {*detectors.DECLARATIONS, *ANALYSES, "weights"}
    found = [hit for path in sorted(OUTPUTS.glob("*.py")) for hit in _names_compared(path, names)]
    assert found == [], "outputs/ should read a declaration, not branch on a name: " + ", ".join(found)
