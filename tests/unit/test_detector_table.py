"""One detector table (issue 38): every declaration (a scan's detector, a score an analysis computes
itself, an hs.detect pattern) sits in ``detectors.DECLARATIONS`` with the part it plays;
``REGISTRY``, ``SCORES`` and ``PATTERNS`` are live views of it, not tables of their own."""

from __future__ import annotations

import pytest
import torch

import headscope as hs
from headscope import detectors
from headscope.core.registry import Registry, View
from headscope.detectors.functionvector import FunctionVectorScore
from headscope.errors import InputError
from headscope.verdicts import roles

PROMPTS = ["t1 t2 t3 t4 t1 t2 t3 t4", "t5 t6 t7 t5 t6 t7 t8 t9"]


def previous(batch):
    content = batch.content
    rows, earlier = (content[:, 1:] & content[:, :-1]).nonzero(as_tuple=True)
    return rows, earlier + 1, earlier


class OwnScore(hs.Detector):
    """A score an analysis (a plugin's) computes itself: described like a role, never scanned."""

    name = "own-score"
    summary = "a plugin analysis' own head score"
    part = "score"
    role = hs.RoleSpec("owns", "a head the plugin's analysis vouches for")

    def update(self, layer, attn, batch, q_start=0):
        raise AssertionError("a score never runs in a scan")


def parts() -> dict[str, set[str]]:
    return {
        "scan": set(detectors.REGISTRY),
        "score": set(detectors.SCORES),
        "pattern": set(detectors.PATTERNS),
    }


def test_the_parts_are_views_of_the_one_table(toy):
    for view in (detectors.REGISTRY, detectors.SCORES, detectors.PATTERNS):
        assert isinstance(view, View) and view.registry is detectors.DECLARATIONS
    hs.detect(toy, None, PROMPTS, "induction_head", name="mine", resamples=0)
    hs.register(hs.TargetDetector("later", targets=previous))
    hs.register(OwnScore)
    found = parts()
    assert found["pattern"] == {"mine"} and {"fv", "long-range", "own-score"} <= found["score"]
    assert "later" in found["scan"] and "induction" in found["scan"]
    # The parts split the table: every name once, and nothing outside it.
    assert sum(len(names) for names in found.values()) == len(detectors.DECLARATIONS)
    assert set().union(*found.values()) == set(detectors.DECLARATIONS)
    for name in detectors.DECLARATIONS:
        assert detectors.declared(name) is detectors.DECLARATIONS[name]
        assert name in found[detectors.DECLARATIONS[name].part]
    assert detectors.declared("nobody") is None


def test_a_pattern_is_replaced_by_its_own_name_and_never_scanned(toy):
    hs.detect(toy, None, PROMPTS, "induction_head", name="mine", resamples=0)
    first = detectors.DECLARATIONS["mine"]
    hs.detect(toy, None, PROMPTS, "previous_token_head", name="mine", resamples=0)
    assert detectors.DECLARATIONS["mine"] is not first and list(detectors.PATTERNS) == ["mine"]
    assert "mine" not in detectors.REGISTRY
    with pytest.raises(InputError, match="scores the prompts its pattern was made for"):
        detectors.create(["mine"])
    with pytest.raises(InputError, match="names an hs.detect pattern"):
        hs.register(hs.TargetDetector("mine", targets=previous))


def test_a_declared_score_joins_the_role_map_and_never_a_scan():
    hs.register(OwnScore)
    assert "own-score" in detectors.SCORES and "own-score" not in detectors.REGISTRY
    assert roles.role_spec("own-score", "").label == "owns"
    assert roles.spec_for_label("owns").meaning == "a head the plugin's analysis vouches for"
    with pytest.raises(InputError, match="unknown detector own-score"):
        detectors.create(["own-score"])
    assert all(d.part == "scan" for d in detectors.create())
    # Names and labels are unique over the whole table, whatever part holds them.
    with pytest.raises(InputError, match="its role label 'owns' is the label of the score 'own-score'"):
        hs.register(hs.TargetDetector("owner", targets=previous, role=hs.RoleSpec("owns", "x")))
    with pytest.raises(InputError, match="names the tables of the"):
        hs.register(hs.TargetDetector("own-score", targets=previous))


def test_a_detector_class_of_another_part_is_refused():
    class Patterned(OwnScore):
        name = "patterned"
        part = "pattern"

    with pytest.raises(InputError, match="part='pattern'; a class is 'scan' or 'score'"):
        hs.register(Patterned)
    with pytest.raises(InputError, match="run it with hs.detect"):
        hs.register(hs.PatternDetector("p", patterns=[torch.eye(3)]))
    assert "patterned" not in detectors.DECLARATIONS and "p" not in detectors.DECLARATIONS


def test_a_view_reads_its_registry_live_and_writes_through_it():
    registry: Registry[str] = Registry("thing", "headscope.test-things", str, lambda s: s)
    odd = registry.view(lambda s: len(s) % 2 == 1)
    registry.add_builtin("one")
    registry.register("four")
    registry.put("three", "three")
    assert list(odd) == ["one", "three"] and odd.builtins() == {"one": "one"}
    assert odd.origin("three") == "registered at run time"
    odd.unregister("three")
    with pytest.raises(InputError, match="'four' was not registered"):
        odd.unregister("four")  # not this view's: the registry keeps it
    with pytest.raises(KeyError):
        del odd["four"]
    assert list(registry) == ["one", "four"] and list(odd) == ["one"]


def test_a_plugin_under_a_scores_name_is_told_why(monkeypatch):
    import importlib.metadata
    import warnings

    from headscope.core.registry import PluginWarning

    class Point:
        name, value, dist = "fv", "fake_plugin:fv", None

        def load(self):
            return hs.TargetDetector("fv", targets=previous, role=hs.RoleSpec("fv-like", "x"))

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [Point()])
    table = Registry(
        "detector", "headscope.detectors", detectors._accept, lambda d: d.name, detectors._label_taken
    )
    for builtin in detectors.DECLARATIONS.builtins().values():
        table.add_builtin(builtin)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert table["fv"] is FunctionVectorScore
    (warning,) = [str(w.message) for w in caught if issubclass(w.category, PluginWarning)]
    # The reason (a score's tables), not only "collides with a built-in", as hs.register says it.
    assert "detector 'fv': 'fv' names the tables of the" in warning and warning.endswith("left out")
