"""The edges of what users add (issue 39): hs.detect's prompts and labels, TargetDetector targets,
the registry under threads and with odd plugins, reserved names, and hs.compare."""

from __future__ import annotations

import math
import sys
import threading
import time
import warnings

import pandas as pd
import pytest
import torch

import headscope as hs
from headscope import detectors
from headscope.analyses import ANALYSES
from headscope.core.registry import PluginWarning, Registry
from headscope.errors import HeadscopeError, InputError, RunFailure
from headscope.extend.protocol import Analysis
from headscope.extend.protocol import _accept as accept_analysis
from headscope.outputs.compare import CompareInputError, compare

PROMPTS = ["t1 t2 t3 t4 t1 t2 t3 t4", "t5 t6 t7 t5 t6 t7 t8 t9"]


def previous(batch):
    content = batch.content
    rows, earlier = (content[:, 1:] & content[:, :-1]).nonzero(as_tuple=True)
    return rows, earlier + 1, earlier


# --- hs.detect: prompts= ---------------------------------------------------------------------------


def test_detect_reads_a_prompt_file_given_as_str_or_path(toy, toy_texts):
    by_str = hs.detect(toy, None, prompts=str(toy_texts), pattern="previous_token_head", resamples=0)
    by_path = hs.detect(toy, None, prompts=toy_texts, pattern="previous_token_head", resamples=0)
    lines = [line for line in toy_texts.read_text().splitlines() if line.strip()]
    by_list = hs.detect(toy, None, prompts=lines, pattern="previous_token_head", resamples=0)
    assert by_path.table.score.tolist() == by_str.table.score.tolist() == by_list.table.score.tolist()


@pytest.mark.parametrize("as_path", [False, True])
def test_detect_refuses_a_prompt_file_it_cannot_read_naming_prompts(toy, tmp_path, monkeypatch, as_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.csv").write_text("text\nt1 t2 t3 t1 t2 t3\n")
    given = tmp_path / "prompts.csv" if as_path else "prompts.csv"
    # Before: the string was scored as a one-token prompt (then "all zeros"); a Path crashed in iter().
    with pytest.raises(
        InputError, match=r"prompts=.*prompts\.csv.*\.csv file.*\.yaml, \.yml, \.jsonl or \.txt"
    ):
        hs.detect(toy, None, prompts=given, pattern="induction_head")
    with pytest.raises(InputError, match=r"prompts='missing\.txt': no such file"):
        hs.detect(toy, None, prompts="missing.txt", pattern="induction_head")
    for wrong in ([tmp_path / "prompts.csv"], 3):
        with pytest.raises(InputError, match=r"prompts=.*expected str \| Path \| list\[str\]"):
            hs.detect(toy, None, prompts=wrong, pattern="induction_head")


# --- hs.detect: labels and names -------------------------------------------------------------------


def test_detect_refuses_a_role_label_another_role_holds(toy):
    with pytest.raises(InputError, match="label='ind' is the role label of detector 'induction'"):
        hs.detect(toy, None, PROMPTS, "induction_head", name="mine", label="ind", resamples=0)
    with pytest.raises(InputError, match="name='copy'.*weight-only role 'copying'"):
        hs.detect(toy, None, PROMPTS, "induction_head", name="copy", resamples=0)
    with pytest.raises(InputError, match="names the tables of"):
        hs.detect(toy, None, PROMPTS, "induction_head", name="fv", label="fvx", resamples=0)
    hs.detect(toy, None, PROMPTS, "induction_head", name="first", label="mine", resamples=0)
    # Another pattern's label is taken too; the same pattern run again keeps its own.
    with pytest.raises(InputError, match="hs.detect pattern 'first'"):
        hs.detect(toy, None, PROMPTS, "induction_head", name="second", label="mine", resamples=0)
    again = hs.detect(toy, None, PROMPTS, "induction_head", name="first", label="mine", resamples=0)
    assert set(again.table.detector) == {"first"}
    # ... and a detector registered later cannot take it either.
    with pytest.raises(InputError, match="hs.detect pattern 'first'"):
        hs.register(hs.TargetDetector("later", targets=previous, role=hs.RoleSpec("mine", "x")))


def test_two_threads_taking_one_new_label_do_not_both_pass(toy, monkeypatch):
    """Both threads pass the label check before either has run; the table's lock lets one keep
    the label and refuses the other, naming the pattern that holds it."""
    import threading

    from headscope.analyses.detect import Detect

    both_checked = threading.Barrier(2, timeout=30)
    check = Detect.check

    def check_then_wait(self, options):
        found = check(self, options)
        both_checked.wait()  # neither runs (nor keeps its pattern) before both have checked
        return found

    monkeypatch.setattr(Detect, "check", check_then_wait)
    outcomes: dict[str, object] = {}

    def run(name: str) -> None:
        try:
            outcomes[name] = hs.detect(
                toy, None, PROMPTS, "induction_head", name=name, label="shared", resamples=0
            )
        except InputError as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=run, args=(name,)) for name in ("race-a", "race-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    refused = [v for v in outcomes.values() if isinstance(v, InputError)]
    assert len(outcomes) == 2 and len(refused) == 1, outcomes
    assert "label='shared' was taken by the hs.detect pattern 'race-" in str(refused[0])


def test_a_pattern_function_that_returns_no_tensor_is_named(toy):
    with pytest.raises(InputError, match=r"pattern 'nothing'.*returned NoneType, not a \[T, T\] tensor"):
        hs.detect(toy, None, PROMPTS, lambda ids: None, name="nothing", resamples=0)


# --- TargetDetector ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_floating_targets_are_refused_in_any_precision(toy, toy_texts, dtype):
    def fractional(batch):
        rows, queries, keys = previous(batch)
        return rows.to(dtype), queries.to(dtype), keys.to(dtype) + 0.5  # 2.5 was cut to 2

    hs.register(hs.TargetDetector("fractional", targets=fractional))
    with pytest.raises(HeadscopeError, match=r"detector 'fractional'.*must be a 1-D tensor of integers"):
        hs.scan(toy, detectors="fractional", text=toy_texts, resamples=0, weights=False)


def test_integer_targets_of_any_width_are_read(toy, toy_texts):
    def narrow(batch):
        return tuple(part.to(torch.int32) for part in previous(batch))

    hs.register(hs.TargetDetector("narrow", targets=narrow))
    hs.register(hs.TargetDetector("wide", targets=previous))
    found = hs.scan(toy, detectors="narrow,wide", text=toy_texts, resamples=0, weights=False).table
    assert found[found.detector == "narrow"].score.tolist() == found[found.detector == "wide"].score.tolist()


def test_targets_empty_in_every_batch_give_no_score(toy, toy_texts, tmp_path):
    def none(batch):
        empty = torch.zeros(0, dtype=torch.long)
        return empty, empty, empty

    hs.register(hs.TargetDetector("never", targets=none))
    result = hs.scan(toy, detectors="never,previous-token", text=toy_texts, resamples=0, weights=False)
    # Before: every head of "never" scored 0.0 from n = 0, without a word.
    assert set(result.table.detector) == {"previous-token"}
    assert any("never: not scored: nothing in the data to score (n = 0" in note for note in result.notes)
    # The report and the files read the table as it is: no row of "never" anywhere.
    result.to_html(tmp_path / "scan.html")
    assert "previous-token" in (tmp_path / "scan.html").read_text()
    assert "never" not in {row["detector"] for row in result.to_dict()["rows"]}


def test_targets_that_raise_name_the_detector_and_its_origin(toy, toy_texts):
    hs.register(hs.TargetDetector("divides", targets=lambda batch: 1 / 0))
    with pytest.raises(RunFailure, match=r"detector 'divides' \(registered at run time\).*ZeroDivisionError"):
        hs.scan(toy, detectors="divides", text=toy_texts, resamples=0, weights=False)


def test_a_detector_whose_prompt_set_is_missing_is_refused_with_its_name(tmp_path):
    missing = tmp_path / "gone.txt"
    with pytest.raises(InputError, match=r"detector 'gone': its prompt set .*gone\.txt does not exist"):
        hs.register(hs.TargetDetector("gone", targets=previous, source=missing))


# --- reserved names ---------------------------------------------------------------------------------


def analysis(name: str) -> type[Analysis]:
    class Named(Analysis):
        summary = "a test analysis"
        options = hs.Stats

        def run(self, loaded, options, prepared, progress):
            raise AssertionError("never runs")

    Named.name = name
    return Named


@pytest.mark.parametrize("name", ["compare", "sweep", "plan-options", "show", "report", "capture"])
def test_hs_register_refuses_an_analysis_under_a_reserved_name(name):
    with pytest.raises(InputError, match=f"analysis '{name}'.*never be reached"):
        hs.register(analysis(name))
    assert name not in ANALYSES


def test_reserved_names_cover_every_api_function_and_cli_command():
    from headscope.cli import app
    from headscope.core.registry import reserved_analysis_name

    commands = {info.name or info.callback.__name__ for info in app.registered_commands}
    api = {name for name in hs.__all__ if name.islower() and not name.startswith("_")}
    api -= {name.replace("-", "_") for name in ANALYSES.builtins()}
    for name in (commands - set(ANALYSES)) | api:
        assert reserved_analysis_name(name) is not None, name
    for name in ANALYSES.builtins():
        assert reserved_analysis_name(name) is None, name


@pytest.mark.parametrize(("name", "needle"), [("weights", "weight-only roles"), ("fv", "tables of")])
def test_hs_register_refuses_a_detector_under_a_reserved_name(name, needle):
    with pytest.raises(InputError, match=needle):
        hs.register(hs.TargetDetector(name, targets=previous))


def test_hs_register_gives_input_errors_not_type_errors():
    with pytest.raises(InputError, match="not a detector"):
        detectors.REGISTRY.register(42)


# --- plugins, through fake entry points ------------------------------------------------------------


class FakeEntryPoint:
    dist = None

    def __init__(self, name: str, load) -> None:
        self.name, self.value, self._load = name, f"fake_plugin:{name}", load

    def load(self):
        return self._load()


def fake_registry(monkeypatch, points, kind: str = "detector") -> Registry:
    """A registry of ``kind`` whose plugins are ``points`` (the real one's checks, a fresh state)."""
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: points)
    if kind == "detector":
        registry = Registry(
            "detector", "headscope.detectors", detectors._accept, lambda d: d.name, detectors._label_taken
        )
        for builtin in detectors.REGISTRY.builtins().values():
            registry.add_builtin(builtin)
        return registry
    return Registry("analysis", "headscope.analyses", accept_analysis, lambda a: a.name)


def loaded_with_warnings(registry: Registry) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(registry)
    return [str(w.message) for w in caught if issubclass(w.category, PluginWarning)]


def test_a_plugin_that_exits_while_importing_is_left_out(monkeypatch):
    def exits():
        raise SystemExit(3)

    registry = fake_registry(monkeypatch, [FakeEntryPoint("exits", exits)])
    (warning,) = loaded_with_warnings(registry)
    assert "failed to import (SystemExit: 3); left out" in warning
    assert "exits" not in registry


def test_ctrl_c_while_a_plugin_imports_still_stops(monkeypatch):
    def interrupted():
        raise KeyboardInterrupt

    registry = fake_registry(monkeypatch, [FakeEntryPoint("slow", interrupted)])
    with pytest.raises(KeyboardInterrupt):
        list(registry)


def test_a_plugin_label_that_is_taken_is_left_out(monkeypatch, tmp_path):
    twin = hs.TargetDetector("ind-twin", targets=previous, role=hs.RoleSpec("ind", "another induction"))
    missing = hs.TargetDetector("no-prompts", targets=previous, source=str(tmp_path / "missing.txt"))
    fine = hs.TargetDetector("fine", targets=previous, role=hs.RoleSpec("fine", "a fine role"))
    again = hs.TargetDetector("fine-again", targets=previous, role=hs.RoleSpec("fine", "the same label"))
    points = [FakeEntryPoint(p.name, lambda p=p: p) for p in (twin, missing, fine, again)]
    registry = fake_registry(monkeypatch, points)
    found = loaded_with_warnings(registry)
    assert len(found) == 3, found
    assert "'ind-twin': its role label 'ind' is the label of detector 'induction'; left out" in found[0]
    assert "detector 'no-prompts': its prompt set" in found[1] and "missing.txt does not exist" in found[1]
    assert "'fine-again': its role label 'fine' is the label of detector 'fine'" in found[2]
    assert [n for n in registry if n not in registry.builtins()] == ["fine"]


def test_a_plugin_analysis_under_a_reserved_name_is_left_out(monkeypatch):
    registry = fake_registry(
        monkeypatch,
        [FakeEntryPoint("sweep", lambda: analysis("sweep")), FakeEntryPoint("ok", lambda: analysis("ok"))],
        "analysis",
    )
    (warning,) = loaded_with_warnings(registry)
    assert "analysis 'sweep'" in warning and "`headscope sweep` is headscope's own command" in warning
    assert list(registry) == ["ok"]


# --- the registry under threads ---------------------------------------------------------------------


def test_threads_registering_one_label_leave_one_holder(monkeypatch):
    # Threads switch every microsecond (not every 5 ms): a check and its addition apart would race.
    previous_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        races(monkeypatch)
    finally:
        sys.setswitchinterval(previous_interval)


def races(monkeypatch) -> None:
    for _ in range(30):
        registry = fake_registry(monkeypatch, [])
        start = threading.Barrier(8)
        won: list[str] = []

        def add(index: int, registry: Registry = registry, start=start, won=won) -> None:
            detector = hs.TargetDetector(f"t{index}", targets=previous, role=hs.RoleSpec("same", "one role"))
            start.wait()
            try:
                registry.register(detector)
                won.append(detector.name)
            except InputError:
                pass

        threads = [threading.Thread(target=add, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        holders = [n for n, d in registry.items() if any(s.label == "same" for s in d.role_specs())]
        assert len(won) == 1 and holders == won


def test_a_registration_racing_the_first_read_sees_the_plugins(monkeypatch):
    """The first read loads the plugins; an hs.register of a plugin's name at the same time waits
    for it and is refused, instead of slipping in while the plugin still imports."""
    importing = threading.Event()

    def slow_plugin():
        importing.set()
        time.sleep(0.3)
        return hs.TargetDetector("plug", targets=previous)

    registry = fake_registry(monkeypatch, [FakeEntryPoint("plug", slow_plugin)])
    reader = threading.Thread(target=lambda: len(registry))
    reader.start()
    assert importing.wait(5)
    with pytest.raises(InputError, match="already defined by the plugin"):
        registry.register(hs.TargetDetector("plug", targets=previous))
    reader.join()
    assert registry.origin("plug").startswith("plugin") and list(registry).count("plug") == 1


# --- hs.compare ------------------------------------------------------------------------------------


def table(model: str, scores: dict[tuple[int, int], float], detector: str = "induction") -> pd.DataFrame:
    rows = [
        {
            "model": model,
            "detector": detector,
            "relation": "",
            "direction": "",
            "data": "repeated-tokens",
            "layer": layer,
            "head": head,
            "score": score,
            "ci_low": math.nan,
            "ci_high": math.nan,
            "role": "",
        }
        for (layer, head), score in scores.items()
    ]
    return pd.DataFrame(rows)


def test_compare_gives_the_rank_correlation():
    # Monotone but not linear: Spearman 1.0, Pearson about 0.76.
    a = table("A", {(0, 0): 0.1, (0, 1): 0.2, (1, 0): 0.3, (1, 1): 0.4})
    b = table("B", {(0, 0): 0.01, (0, 1): 0.02, (1, 0): 0.03, (1, 1): 0.9})
    (change,) = compare(a, b).tables
    assert change.correlation == pytest.approx(1.0)
    # One swap in four: 1 - 6 * 2 / (4 * 15) = 0.8.
    b = table("B", {(0, 0): 0.01, (0, 1): 0.02, (1, 0): 0.9, (1, 1): 0.03})
    (change,) = compare(a, b).tables
    assert change.correlation == pytest.approx(0.8)


def test_compare_refuses_results_of_different_layouts():
    two_by_four = table("A", {(layer, head): 0.1 * head for layer in range(2) for head in range(4)})
    three_by_two = table("B", {(layer, head): 0.1 * head for layer in range(3) for head in range(2)})
    with pytest.raises(CompareInputError, match="A has 2 layers x 4 heads, B has 3 layers x 2 heads"):
        compare(two_by_four, three_by_two)


def test_compare_names_the_tables_it_could_not_pair():
    scores = {(0, 0): 0.1, (0, 1): 0.2, (1, 0): 0.3, (1, 1): 0.4}
    with pytest.raises(CompareInputError, match="share no table"):
        compare(table("A", scores), table("B", scores, "previous-token"))
    both = pd.concat([table("B", scores), table("B", scores, "previous-token")], ignore_index=True)
    result = compare(table("A", scores), both)
    assert result.notes == ["only in B, not compared: repeated-tokens · previous-token"]


def test_hs_compare_of_results_with_different_detectors(toy):
    a = hs.detect(toy, None, PROMPTS, "induction_head", name="pat-a", label="pa", resamples=0)
    b = hs.detect(toy, None, PROMPTS, "previous_token_head", name="pat-b", label="pb", resamples=0)
    with pytest.raises(CompareInputError, match="share no table"):
        hs.compare(a, b)
    assert len(hs.compare(a, a).tables) == 1


def test_compare_refuses_a_side_without_scores():
    scores = {(0, 0): 0.1, (0, 1): 0.2}
    # An empty side has no layout to check and nothing to compare.
    with pytest.raises(CompareInputError, match="B has no head scores"):
        compare(table("A", scores), table("B", scores).iloc[0:0])


def test_a_plugin_declaration_that_raises_while_accepted_is_left_out(monkeypatch):
    class Exploding(Analysis):
        name = "exploding"
        summary = "raises when instantiated"
        options = hs.Stats

        def __init__(self) -> None:
            raise RuntimeError("boom")

        def run(self, loaded, options, prepared, progress):
            raise AssertionError("never runs")

    registry = fake_registry(
        monkeypatch,
        [FakeEntryPoint("exploding", lambda: Exploding), FakeEntryPoint("ok", lambda: analysis("ok"))],
        "analysis",
    )
    # Before: only TypeError and InputError were caught, so the first read raised RuntimeError.
    (warning,) = loaded_with_warnings(registry)
    assert "boom; left out" in warning and list(registry) == ["ok"]


def test_hs_register_refuses_a_pattern_detector_with_an_input_error():
    pattern = hs.PatternDetector("mine-p", patterns=[torch.eye(3)])
    with pytest.raises(InputError, match="run it with hs.detect"):
        hs.register(pattern)


def test_patterns_from_numpy_are_read_and_odd_ones_named(toy):
    import numpy as np
    from conftest import TOY_DIR
    from transformers import AutoTokenizer

    lengths = [len(AutoTokenizer.from_pretrained(TOY_DIR)(p)["input_ids"]) for p in PROMPTS]
    as_numpy = [np.tril(np.ones((n, n)), -1) for n in lengths]
    from_numpy = hs.detect(toy, None, PROMPTS, as_numpy, name="from-numpy", resamples=0)
    from_torch = hs.detect(
        toy, None, PROMPTS, [torch.as_tensor(a) for a in as_numpy], name="torch-p", resamples=0
    )
    assert from_numpy.table.score.tolist() == from_torch.table.score.tolist()
    with pytest.raises(InputError, match=r"pattern\[1\] is NoneType, not a \[T, T\] tensor"):
        hs.detect(toy, None, PROMPTS, [torch.as_tensor(as_numpy[0]), None], name="mixed")
    # Complex weights were cast to real without a word (the imaginary part dropped).
    complex_pattern = [torch.as_tensor(a).to(torch.complex64) for a in as_numpy]
    with pytest.raises(InputError, match="pattern of prompt 0 is complex"):
        hs.detect(toy, None, PROMPTS, complex_pattern, name="cplx", resamples=0)


def test_declarations_name_what_is_wrong_with_their_arguments():
    with pytest.raises(InputError, match="summary= takes a text, got int"):
        hs.TargetDetector("x", targets=previous, summary=3)
    with pytest.raises(InputError, match="patterns= takes a list of"):
        hs.PatternDetector("x", patterns=None)


def test_a_detector_class_of_a_notebook_that_raises_is_named(toy, toy_texts):
    class Raising(hs.Detector):
        name = "raising"
        summary = "raises in update"

        def update(self, layer, attn, batch, q_start=0):
            raise KeyError("oops")

    hs.register(Raising)
    # Before: KeyError 'oops', naming neither the detector nor where it came from.
    with pytest.raises(
        RunFailure, match=r"detector 'raising' \(registered at run time\): its update\(\) raised KeyError"
    ):
        hs.scan(toy, detectors="raising", text=toy_texts, resamples=0, weights=False)


def test_a_detector_class_of_a_notebook_scores_as_its_built_in_twin(toy, toy_texts):
    from headscope.detectors.positional import SinkDetector

    class SinkCopy(SinkDetector):
        name = "sink-copy"
        role = None

    hs.register(SinkCopy)
    table = hs.scan(toy, detectors="sink,sink-copy", text=toy_texts, resamples=0, weights=False).table
    assert (
        table[table.detector == "sink"].score.tolist() == table[table.detector == "sink-copy"].score.tolist()
    )
