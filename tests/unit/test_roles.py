"""Roles, multiple comparisons and reproducibility on synthetic attention."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pandas as pd
import pytest
import torch

from headscope import detectors
from headscope.capture import make_batches
from headscope.detectors import Detector, RoleSpec, create
from headscope.models import HeadLayout
from headscope.outputs.report import table_csv
from headscope.verdicts.results import head_table, uncertainty_notes
from headscope.verdicts.roles import (
    RoleRule,
    assign_roles,
    head_roles,
    role_label,
    role_spec,
    spec_for_label,
)
from headscope.verdicts.stats import benjamini_hochberg, one_sided_p

LAYOUT = HeadLayout(n_layers=2, n_heads=3, n_kv_heads=3, head_dim=4, d_model=12, max_positions=None)


def _planted(name: str, head: int, plant, n_sequences: int, length: int, seed: int):
    """Detector ``name`` on random sequences: uniform causal attention everywhere except
    ``plant(uniform, gen)`` in head ``head`` of layer 1. Returns (results, batch)."""
    gen = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(5, 500, (length,), generator=gen).tolist() for _ in range(n_sequences)]
    batch = make_batches(
        seqs, [[False] * length] * n_sequences, batch_size=n_sequences, pad_id=0, is_causal=True
    )[0]
    causal = torch.ones(length, length).tril()
    uniform = causal / causal.sum(-1, keepdim=True)
    detector = create([name])[0]
    detector.start(LAYOUT, n_sequences)
    for layer in range(2):
        attn = uniform.expand(n_sequences, 3, length, length).clone()
        if layer == 1:
            attn[:, head] = plant(uniform, gen)
        detector.consume(layer, attn, batch)
    return detector.results("synthetic"), batch


def planted_previous_token_results(n_sequences: int = 24, length: int = 16, seed: int = 0):
    """Head (1, 0) attends to the previous token with weight ~0.8; every other head is uniform."""

    def plant(uniform, gen):
        noise = 0.15 * torch.rand(n_sequences, length, generator=gen)
        planted = torch.zeros(n_sequences, length, length)
        idx = torch.arange(1, length)
        planted[:, idx, idx - 1] = 0.8 + noise[:, 1:] - 0.075
        planted[:, 1:, 0] += 1 - planted[:, 1:].sum(-1)
        planted[:, 0, 0] = 1.0
        return planted

    return _planted("previous-token", 0, plant, n_sequences, length, seed)[0]


def test_planted_interval_excludes_baseline_and_uniform_gets_no_role():
    table = assign_roles(head_table(planted_previous_token_results(), LAYOUT, "synthetic", seed=1))
    planted = table[(table.layer == 1) & (table["head"] == 0)].iloc[0]
    assert planted.ci_low > planted.baseline + 0.5
    assert planted.role == "prev"
    others = table[~((table.layer == 1) & (table["head"] == 0))]
    assert (others.role == "").all()
    # Uniform attention scores exactly the uniform baseline.
    assert np.allclose(others.score, others.baseline)
    roles = head_roles(table)
    assert roles[roles.role != ""][["layer", "head"]].values.tolist() == [[1, 0]]


def test_same_seed_same_bytes_different_seed_only_intervals():
    results = planted_previous_token_results()
    a = table_csv(assign_roles(head_table(results, LAYOUT, "m", seed=7)))
    b = table_csv(assign_roles(head_table(results, LAYOUT, "m", seed=7)))
    assert a == b
    c = assign_roles(head_table(results, LAYOUT, "m", seed=8))
    first = assign_roles(head_table(results, LAYOUT, "m", seed=7))
    fixed = ["model", "detector", "layer", "head", "kv_group", "score", "baseline", "n", "rank", "role"]
    pd.testing.assert_frame_equal(first[fixed], c[fixed])
    planted = (first.layer == 1) & (first["head"] == 0)
    assert not np.allclose(first.loc[planted, "ci_low"], c.loc[planted, "ci_low"])


def test_threshold_and_margin_are_settable():
    table = head_table(planted_previous_token_results(), LAYOUT, "synthetic", seed=1)
    assert (assign_roles(table, RoleRule(threshold=0.95)).role == "").all()
    assert (assign_roles(table, RoleRule(margin=0.9)).role == "").all()


def test_benjamini_hochberg_and_p_values():
    p = np.array([0.01, 0.04, 0.03, 0.5])
    adjusted = benjamini_hochberg(p)
    # Hand-computed: sorted p = .01 .03 .04 .5 -> .04 .06 .0533 .5 -> step-up minimum .04 .0533 .0533 .5
    assert np.allclose(adjusted, [0.04, 0.0533333, 0.0533333, 0.5])
    assert one_sided_p(np.array([0.5]), 0.4, np.array([0.05]))[0] < 0.05
    assert one_sided_p(np.array([0.5]), 0.4, np.array([0.0]))[0] == 0.0
    assert one_sided_p(np.array([0.3]), 0.4, np.array([0.0]))[0] == 1.0


def test_sink_is_only_a_fallback_role():
    rows = []
    for detector, score, baseline in (("sink", 0.99, 0.1), ("induction", 0.6, 0.02)):
        rows.append(
            dict(
                model="m",
                detector=detector,
                relation="",
                direction="",
                layer=0,
                head=0,
                kv_group=0,
                score=score,
                baseline=baseline,
                ci_low=score - 0.05,
                ci_high=score + 0.05,
                n=100,
                rank=1,
                role="",
                data="d" + detector,
                se=0.01,
                role_null=baseline,
            )
        )
    roles = head_roles(assign_roles(pd.DataFrame(rows)))
    assert roles.role.tolist() == ["ind"] and roles.n_roles.tolist() == [2]
    assert roles.secondary.tolist() == ["sink"]  # the role it also holds, for --roles-csv


@pytest.mark.parametrize("n_sequences", [1, 4])
def test_too_few_examples_give_no_role_even_to_a_planted_head(n_sequences):
    """One sequence used to give a zero-width interval, p = 0, and a "significant" role."""
    table = assign_roles(head_table(planted_previous_token_results(n_sequences), LAYOUT, "s", seed=1))
    planted = table[(table.layer == 1) & (table["head"] == 0)].iloc[0]
    assert planted.score > 0.7  # the head is there ...
    assert np.isnan(planted.ci_low) and np.isnan(planted.ci_high)  # ... but nothing can be tested
    assert (table.role == "").all()
    notes = uncertainty_notes(planted_previous_token_results(n_sequences), 1000)
    assert len(notes) == 1 and "too few to test" in notes[0] and f"{n_sequences} example" in notes[0]


def test_no_resamples_means_no_intervals_and_no_roles():
    results = planted_previous_token_results()
    table = assign_roles(head_table(results, LAYOUT, "s", n_resamples=0))
    assert table.ci_low.isna().all() and (table.role == "").all()
    assert uncertainty_notes(results, 0) == ["--resamples 0: scores without intervals, and so without roles"]
    # The CSV shows the missing interval as empty cells, never as a point.
    csv_rows = table_csv(table).splitlines()
    header = csv_rows[0].split(",")
    first = dict(zip(header, csv_rows[1].split(","), strict=True))
    assert first["ci_low"] == "" and first["ci_high"] == ""


def test_role_map_marks_global_layers_where_some_layers_are_local():
    from rich.console import Console

    from headscope.analyses import Report
    from headscope.outputs.report import print_role_map, report_json

    table = assign_roles(head_table(planted_previous_token_results(), LAYOUT, "synthetic", seed=1))
    windowed = dataclasses.replace(LAYOUT, local_layers=(0,), window=4)
    console = Console(record=True, width=100, color_system=None)
    print_role_map(Report("synthetic", table, [], "stream", layout=windowed), console, "rule")
    text = console.export_text()
    assert "L1 G" in text and "L0 G" not in text
    assert "G: global attention layer; the others attend within a sliding window of 4 tokens" in text
    data = report_json(Report("synthetic", table, [], "stream", layout=windowed), "test")
    assert data["layers"] == {"local": [0], "global": [1], "window": 4}
    # A model whose layers all attend globally gets no marks.
    console = Console(record=True, width=100, color_system=None)
    print_role_map(Report("synthetic", table, [], "stream", layout=LAYOUT), console, "rule")
    assert " G" not in console.export_text()


# --- a new role: one detector class with its RoleSpec, one registry line --------------------------


class SkipTokenDetector(Detector):
    """A throwaway attention-pattern role: attention from position i to i - 2 (whole maps only)."""

    name = "skip-token"
    summary = "attention from position i to i-2"
    default_source = "text"
    role = RoleSpec("skip", "attention two tokens back", "#123abc", "bold magenta", data="natural text")

    def update(self, layer: int, attn: torch.Tensor, batch, q_start: int = 0) -> None:
        length = attn.shape[2]
        per_head = attn.diagonal(offset=-2, dim1=2, dim2=3).sum(-1)  # [B, H]
        counts = torch.full((attn.shape[0],), float(length - 2))
        # Causal uniform attention puts 1 / (i + 1) on key i - 2.
        baseline = (1.0 / torch.arange(3, length + 1, dtype=torch.float64)).sum().expand(attn.shape[0])
        self._accumulate(layer, batch, per_head, counts, baseline)


@pytest.fixture
def skip_token_registered(monkeypatch):
    monkeypatch.setitem(detectors.REGISTRY, SkipTokenDetector.name, SkipTokenDetector)


def planted_skip_token_results(n_sequences: int = 24, length: int = 16, seed: int = 0):
    """Head (1, 2) attends two tokens back with weight ~0.8; every other head is uniform."""

    def plant(uniform, gen):
        planted = torch.zeros(length, length)
        planted[:2] = uniform[:2]
        idx = torch.arange(2, length)
        planted[idx, idx - 2] = 0.8
        planted[idx, 0] += 0.2
        noise = 0.1 * torch.rand(n_sequences, length, generator=gen)
        head = planted.expand(n_sequences, length, length).clone()
        head[:, idx, idx - 2] -= noise[:, 2:]
        head[:, idx, 0] += noise[:, 2:]
        return head

    return _planted(SkipTokenDetector.name, 2, plant, n_sequences, length, seed)


def test_a_new_detector_needs_only_its_class_and_a_registry_line(skip_token_registered):
    from rich.console import Console

    from headscope.analyses import Report
    from headscope.outputs import report_data
    from headscope.outputs.report import jsonable, print_role_map, report_json, roles_records

    assert role_label("skip-token", "") == "skip"
    assert role_spec("skip-token", "") is SkipTokenDetector.role
    assert spec_for_label("skip") is SkipTokenDetector.role
    results, _ = planted_skip_token_results()
    table = assign_roles(head_table(results, LAYOUT, "synthetic", seed=1))
    assert table.loc[table.role != "", ["layer", "head", "role"]].values.tolist() == [[1, 2, "skip"]]
    report = Report("synthetic", table, [], "stream", layout=LAYOUT)
    # The terminal role map: the label in its grid, its meaning in the legend, its style on the cell.
    console = Console(
        record=True, width=100, color_system="standard", force_terminal=True, file=io.StringIO()
    )
    print_role_map(report, console, "rule")
    text = console.export_text(clear=False)
    assert "legend: skip = attention two tokens back" in text
    assert "1 of 6 heads have a role (skip 1)" in text
    styled = console.export_text(styles=True)
    assert "\x1b[1;35mskip" in styled  # bold magenta
    # The HTML report's legend.
    saved = jsonable(report_json(report, "scan", roles=roles_records(report)))
    built = report_data.build(saved)
    assert built["roles"] == [{"label": "skip", "meaning": "attention two tokens back", "color": "#123abc"}]


def test_verify_notes_a_table_without_a_causal_check(skip_token_registered):
    """A role whose spec defines no verification gets a note in the report instead of exit 2."""
    from types import SimpleNamespace

    from headscope.analyses import Report, Section, verify

    results, batch = planted_skip_token_results()
    table = assign_roles(head_table(results, LAYOUT, "synthetic", seed=1))
    sections = [
        Section(
            r.detector, r.relation, r.direction, "", r.data, "", r.n, r.n_examples, r.baseline(), "uniform"
        )
        for r in results
    ]
    # A detector nobody registered has no spec, so no check either.
    sections.append(dataclasses.replace(sections[0], detector="unregistered"))
    report = Report("synthetic", table, sections, "stream", inputs={"synthetic": [batch]}, layout=LAYOUT)
    loaded = SimpleNamespace(is_causal=True, has_lm_head=True, layout=LAYOUT)
    assert role_spec("skip-token", "").verify is None
    assert verify(loaded, report, k=1) == []
    assert report.notes == [
        "verify: no causal check is defined for synthetic · skip-token",
        "verify: no causal check is defined for synthetic · unregistered",
    ]
    verify(loaded, report, k=1)  # checking again does not repeat the notes
    assert len(report.notes) == 2


def test_every_registered_role_has_a_spec_with_a_legend():
    """Each detector declares its roles: a label, a meaning and a colour for the legends."""
    for name, cls in detectors.REGISTRY.items():
        specs = cls.role_specs()
        assert specs, f"{name} declares no RoleSpec"
        for spec in specs:
            assert spec.label and spec.meaning and spec.color.startswith("#"), (name, spec)
            assert spec.kind in {"threshold", "signed", "descriptive"}
    labels = [
        s.label for cls in detectors.REGISTRY.values() for s in cls.role_specs() if s.kind != "descriptive"
    ]
    assert len(labels) == len(set(labels)), "two roles share a label"
