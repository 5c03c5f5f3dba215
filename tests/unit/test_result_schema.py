"""The saved result's schema: what ``headscope report``, ``Result.from_json`` and the HTML report read.

A real result (a scan of the toy model) is broken in one place at a time. Each break ends in one
``error:`` line naming the file, the JSON path and what to do, exit 2, no traceback; random
documents and random mutations of the real one either load (and draw a report) or give that line.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import headscope as hs
from headscope import __version__
from headscope.api.result import MAX_HEADS, RESULT_SCHEMA, Result, check_result
from headscope.cli import app
from headscope.errors import InputError
from headscope.outputs import report_data

runner = CliRunner()

FAST = {
    "detectors": "previous-token,duplicate-token,induction,sink",
    "resamples": 200,
    "seq_len": 20,
    "n_seqs": 8,
}
LONG = 1_000_000


@pytest.fixture(scope="module")
def saved(toy_dir, toy_texts) -> dict[str, Any]:
    """A real result as headscope writes it (to_json), read back as plain JSON."""
    return json.loads(hs.scan(str(toy_dir), text=toy_texts, **FAST).to_json())


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def _drop(doc: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    target = doc
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    return doc


def _repeat_row(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["rows"].append(dict(doc["rows"][5]))
    return doc


def _repeat_role(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["roles"].append(dict(doc["roles"][2]))
    return doc


# (id, how the document is broken, what the one line must name)
HOSTILE: list[tuple[str, Any, list[str]]] = [
    ("not-an-object", lambda d: [d], ["not a headscope result"]),
    ("rows-not-a-list", lambda d: _set(d, ("rows",), {"layer": 0}), ["rows: expected a list"]),
    ("rows-empty", lambda d: _set(d, ("rows",), []), ["no head rows"]),
    ("row-not-an-object", lambda d: _set(d, ("rows", 3), [1, 2]), ["rows[3]: expected an object"]),
    ("row-layer-negative", lambda d: _set(d, ("rows", 12, "layer"), -1), ["rows[12].layer", "-1"]),
    ("row-layer-string", lambda d: _set(d, ("rows", 12, "layer"), "1"), ["rows[12].layer", "integer"]),
    ("row-layer-fraction", lambda d: _set(d, ("rows", 1, "layer"), 0.5), ["rows[1].layer"]),
    ("row-head-bool", lambda d: _set(d, ("rows", 2, "head"), True), ["rows[2].head", "true"]),
    ("row-head-missing", lambda d: _drop(d, ("rows", 4, "head")), ["rows[4].head: missing"]),
    ("row-detector-missing", lambda d: _drop(d, ("rows", 0, "detector")), ["rows[0].detector: missing"]),
    ("row-detector-number", lambda d: _set(d, ("rows", 0, "detector"), 7), ["rows[0].detector", "string"]),
    ("row-score-nan", lambda d: _set(d, ("rows", 6, "score"), float("nan")), ["rows[6].score", "finite"]),
    ("row-score-inf", lambda d: _set(d, ("rows", 6, "score"), float("inf")), ["rows[6].score", "finite"]),
    ("row-score-huge-int", lambda d: _set(d, ("rows", 6, "score"), 10**400), ["rows[6].score", "digits"]),
    ("row-score-text", lambda d: _set(d, ("rows", 6, "score"), "high"), ["rows[6].score", '"high"']),
    ("row-score-missing", lambda d: _drop(d, ("rows", 6, "score")), ["rows[6].score: missing"]),
    ("row-ci-object", lambda d: _set(d, ("rows", 7, "ci_low"), {}), ["rows[7].ci_low", "an object"]),
    ("row-n-negative", lambda d: _set(d, ("rows", 7, "n"), -3), ["rows[7].n"]),
    ("row-rank-zero", lambda d: _set(d, ("rows", 7, "rank"), 0), ["rows[7].rank", "positive"]),
    ("row-role-list", lambda d: _set(d, ("rows", 7, "role"), ["ind"]), ["rows[7].role", "a list of 1"]),
    ("row-repeated", _repeat_row, ["rows[32]: repeats rows[5]", "appears once"]),
    ("row-layer-beyond-model", lambda d: _set(d, ("rows", 9, "layer"), 40), ["rows[9].layer", "2 layers"]),
    ("row-head-beyond-model", lambda d: _set(d, ("rows", 9, "head"), 4), ["rows[9].head", "4 heads"]),
    ("row-kv-beyond-model", lambda d: _set(d, ("rows", 9, "kv_group"), 2), ["rows[9].kv_group"]),
    ("row-layer-10-to-30", lambda d: _set(d, ("rows", 9, "layer"), 10**30), ["rows[9].layer", "digits"]),
    ("layout-missing", lambda d: _drop(d, ("layout",)), ["layout: missing"]),
    ("layout-list", lambda d: _set(d, ("layout",), [2, 4]), ["layout: expected an object"]),
    ("layout-layers-zero", lambda d: _set(d, ("layout", "layers"), 0), ["layout.layers", "positive"]),
    ("layout-heads-null", lambda d: _set(d, ("layout", "heads"), None), ["layout.heads"]),
    (
        "layout-enormous",
        lambda d: _set(d, ("layout",), {"layers": 10**6, "heads": 10**6}),
        ["layout:", f"at most {MAX_HEADS}"],
    ),
    ("layout-kv-over-heads", lambda d: _set(d, ("layout", "kv_heads"), 9), ["layout.kv_heads"]),
    (
        "layout-local-beyond",
        lambda d: _set(d, ("layout", "local_layers"), [0, 5]),
        ["layout.local_layers[1]", "2 layers"],
    ),
    ("layers-local-text", lambda d: _set(d, ("layers",), {"local": "0,1"}), ["layers.local"]),
    ("sections-object", lambda d: _set(d, ("sections",), {"a": 1}), ["sections: expected a list"]),
    ("section-number", lambda d: _set(d, ("sections", 1), 3), ["sections[1]: expected an object"]),
    ("section-baseline-text", lambda d: _set(d, ("sections", 0, "baseline"), "x"), ["sections[0].baseline"]),
    ("section-no-detector", lambda d: _drop(d, ("sections", 2, "detector")), ["sections[2].detector"]),
    ("roles-object", lambda d: _set(d, ("roles",), {"0": 1}), ["roles: expected a list"]),
    ("role-head-beyond", lambda d: _set(d, ("roles", 3, "head"), 99), ["roles[3].head", "4 heads"]),
    ("role-repeated", _repeat_role, ["roles[8]: repeats roles[2]"]),
    ("role-secondary-list", lambda d: _set(d, ("roles", 1, "secondary"), [1]), ["roles[1].secondary"]),
    ("notes-string", lambda d: _set(d, ("notes",), "a note"), ["notes: expected a list"]),
    ("note-number", lambda d: _set(d, ("notes",), ["ok", 3]), ["notes[1]", "string"]),
    ("command-empty", lambda d: _set(d, ("command",), " "), ["command", "non-empty"]),
    ("model-number", lambda d: _set(d, ("model",), 12), ["model: expected a string"]),
    ("headscope-number", lambda d: _set(d, ("headscope",), 0.1), ["headscope: expected a string"]),
    ("copy-loss-list", lambda d: _set(d, ("copy_loss",), [1.0]), ["copy_loss: expected an object"]),
    (
        "copy-loss-tokens-text",
        lambda d: _set(d, ("copy_loss",), {"per_copy": [1.0], "tokens_per_copy": ["x"]}),
        ["copy_loss.tokens_per_copy[0]"],
    ),
    ("verification-number", lambda d: _set(d, ("verification",), 5), ["verification"]),
    ("verification-list-of-text", lambda d: _set(d, ("verification",), ["a"]), ["verification"]),
    ("outcomes-list", lambda d: _set(d, ("outcomes",), [1]), ["outcomes: expected an object"]),
    ("spec-object", lambda d: _set(d, ("spec",), {"a": 1}), ["spec"]),
    # versions
    ("schema-newer", lambda d: _set(d, ("schema",), "headscope-result/2"), ["newer headscope", "upgrade"]),
    ("schema-foreign", lambda d: _set(d, ("schema",), "other/1"), ["schema", RESULT_SCHEMA]),
    ("schema-report-data", lambda d: _set(d, ("schema",), "headscope-report/1"), ["HTML report's data"]),
    ("schema-number", lambda d: _set(d, ("schema",), 2), ["schema: expected a string"]),
    ("writer-newer-major", lambda d: _set(d, ("headscope",), "9.0.0"), ["newer major version", "upgrade"]),
    # long values are elided
    (
        "huge-score-text",
        lambda d: _set(d, ("rows", 1, "score"), "x" * LONG),
        ["rows[1].score", f"({LONG + 2} characters)"],
    ),
    (
        "huge-schema",
        lambda d: _set(d, ("schema",), "s" * LONG),
        ["schema", f"({LONG + 2} characters)"],
    ),
    (
        "huge-repeated-detector",
        lambda d: {
            **d,
            "rows": [{**r, "detector": "d" * LONG, "layer": 0, "head": 0} for r in d["rows"][:2]],
        },
        ["rows[1]: repeats rows[0]", f"({LONG + 2} characters)"],
    ),
]
HOSTILE_IDS = [case[0] for case in HOSTILE]
# Where the file reader (headscope.sweeps.results) answers before the schema does.
CLI_NEEDLE = {"rows-not-a-list": "no head rows"}


def _one_line(message: str) -> None:
    assert message.strip() and "\n" not in message, message
    assert len(message) < 600, len(message)


@pytest.mark.parametrize(("case", "breaks", "names"), HOSTILE, ids=HOSTILE_IDS)
def test_a_broken_result_is_refused_with_its_json_path(saved, case, breaks, names):
    broken = breaks(saved)
    with pytest.raises(InputError) as caught:
        Result.from_json(broken)
    message = str(caught.value)
    _one_line(message)
    for needle in names:
        assert needle in message, (case, message)


@pytest.mark.parametrize(("case", "breaks", "names"), HOSTILE, ids=HOSTILE_IDS)
def test_report_refuses_a_broken_result_with_one_line(saved, tmp_path, case, breaks, names):
    path = tmp_path / "result.json"
    path.write_text(json.dumps(breaks(saved), allow_nan=True))
    target = tmp_path / "report.html"
    result = runner.invoke(app, ["report", str(path), "--html", str(target), "--no-examples"])
    assert result.exit_code == 2, (case, result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "unexpected" not in errors[0]
    line = result.stderr.replace("\n", " ")
    assert str(path) in line or "result.json" in line, line
    assert CLI_NEEDLE.get(case, names[0]) in line, (case, line)
    assert not target.exists()


def test_the_real_result_loads_and_its_report_has_the_models_size(saved):
    result = Result.from_json(copy.deepcopy(saved))
    assert result.notes == []
    built = report_data.build(result.to_dict())
    assert (built["model"]["layers"], built["model"]["heads"]) == (2, 4)
    assert len(built["heads"]) == 8


def test_the_role_map_size_comes_from_the_layout_not_the_largest_row(saved):
    """Rows of layer 0 only, in a 3-layer model: the role map still has every layer's heads."""
    doc = copy.deepcopy(saved)
    doc["rows"] = [row for row in doc["rows"] if row["layer"] == 0]
    doc["roles"] = [role for role in doc["roles"] if role["layer"] == 0]
    doc["layout"]["layers"] = 3
    built = report_data.build(Result.from_json(doc).to_dict())
    assert built["model"]["layers"] == 3
    assert {(h["layer"], h["head"]) for h in built["heads"]} == {(a, b) for a in range(3) for b in range(4)}
    assert built["model"]["global_layers"] == [0, 1, 2]
    Result.from_json(doc).html(examples=False)  # the page's own check agrees


def test_unknown_keys_of_the_same_format_are_ignored(saved):
    doc = copy.deepcopy(saved)
    doc["schema"] = RESULT_SCHEMA
    doc["from_the_future"] = {"x": [1, 2]}
    doc["rows"][0]["new_column"] = "anything"
    doc["layout"]["experts"] = 8
    result = Result.from_json(doc)
    assert result.notes == []
    assert "from_the_future" not in result.html(examples=False)


def test_a_newer_minor_writer_is_read_with_a_note(saved):
    major, minor = (int(part) for part in __version__.split(".")[:2])
    doc = _set(saved, ("headscope",), f"{major}.{minor + 1}.0")
    result = Result.from_json(doc)
    assert len(result.notes) == 1 and "newer than this" in result.notes[0]
    assert "newer than this" in result.html(examples=False)


def test_an_older_or_odd_writer_version_is_read_without_a_note(saved):
    for version in ("0.0.1", "dev", "", "0.1"):
        assert Result.from_json(_set(saved, ("headscope",), version)).notes == []


def test_check_result_names_its_source(saved):
    with pytest.raises(InputError, match=r"^runs/a\.json: rows\[0\]\.layer: "):
        check_result(_set(saved, ("rows", 0, "layer"), -2), "runs/a.json")


def test_json_text_beyond_the_parsers_limits_is_refused(tmp_path):
    deep = "[" * 100_000 + "]" * 100_000
    digits = '{"rows": [], "command": "scan", "n": ' + "9" * 5000 + "}"
    for text in (digits, '{"a": ' + deep + "}"):
        with pytest.raises(InputError) as caught:
            Result.from_json(text)
        _one_line(str(caught.value))
        path = tmp_path / "odd.json"
        path.write_text(text)
        with pytest.raises(InputError) as caught:
            Result.from_json(path)
        _one_line(str(caught.value))
        assert "odd.json" in str(caught.value)


def test_a_model_that_does_not_fit_the_result_is_refused_before_drawing(saved, toy):
    doc = _set(saved, ("layout", "layers"), 3)
    result = Result.from_json(doc).attach(toy)
    with pytest.raises(InputError, match=r"2 layers × 4 heads; the result was made on 3 × 4"):
        result.html()
    assert result._examples is None  # refused before the heatmaps were computed


# --- property tests: random documents and random mutations of the real one -----------------------

FUZZ = settings(
    settings.default,
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["", "induction", "ind", "headscope-result/2", "9.0.0", "0.1.5", "x" * 200])
)
JSON = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=16,
)
KNOWN = ["headscope", "command", "model", "sections", "rows", "layout", "roles", "notes", "layers"]
KNOWN += ["copy_loss", "outcomes", "verification", "schema", "spec", "capture"]
ROW_KEYS = ["detector", "relation", "direction", "data", "layer", "head", "kv_group", "score", "role"]
ROW_KEYS += ["baseline", "ci_low", "ci_high", "n", "rank"]


def loads_or_one_line(doc: Any) -> Result | None:
    """The property: the document loads and draws a report, or one InputError line; nothing else."""
    try:
        result = Result.from_json(doc)
    except InputError as exc:
        _one_line(str(exc))
        return None
    page = result.html(examples=False)
    assert page.startswith("<!DOCTYPE html>")
    result.table  # noqa: B018
    result.roles  # noqa: B018
    repr(result)
    layout = result.to_dict()["layout"]
    assert all(0 <= r["layer"] < layout["layers"] and 0 <= r["head"] < layout["heads"] for r in doc["rows"])
    return result


ROWS = st.lists(
    st.fixed_dictionaries(
        {"detector": st.sampled_from(["induction", "previous-token"]) | JSON},
        optional={key: st.integers(min_value=-2, max_value=6) | JSON for key in ROW_KEYS[1:]},
    ),
    max_size=6,
)
DOCUMENTS = st.fixed_dictionaries(
    {"rows": ROWS | JSON, "command": st.just("scan") | JSON},
    optional={
        key: JSON
        | st.fixed_dictionaries(
            {"layers": st.integers(-1, 4), "heads": st.integers(-1, 5)},
            optional={"kv_heads": st.integers(-1, 6) | JSON, "local_layers": JSON},
        )
        for key in KNOWN
        if key not in ("rows", "command")
    },
)


@FUZZ
@given(DOCUMENTS)
def test_random_documents_load_or_give_one_line(document):
    loads_or_one_line(document)


@FUZZ
@given(JSON)
def test_random_json_loads_or_gives_one_line(document):
    loads_or_one_line(document)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:6]):  # a few of each list: the paths stay few
            out += _paths(item, (*prefix, index))
    return out


MUTATIONS = st.lists(
    st.tuples(st.sampled_from(["replace", "drop", "repeat", "number"]), st.integers(0, 10**6), JSON),
    min_size=1,
    max_size=3,
)


def _mutate(doc: dict[str, Any], kind: str, pick: int, value: Any) -> dict[str, Any]:
    paths = _paths(doc)
    path = paths[pick % len(paths)]
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if kind == "drop":
        del parent[last]
    elif kind == "repeat" and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[last]))
    elif kind == "number":
        parent[last] = [-1, 0, 1, 2, 3, 4, 5, 10**9, 0.5, float("nan")][pick % 10]
    else:
        parent[last] = value
    return doc


@FUZZ
@given(MUTATIONS)
def test_mutations_of_a_real_result_load_or_give_one_line(saved, mutations):
    doc = copy.deepcopy(saved)
    for kind, pick, value in mutations:
        doc = _mutate(doc, kind, pick, value)
    loads_or_one_line(doc)


@settings(FUZZ, max_examples=25)
@given(mutations=MUTATIONS)
def test_mutated_files_through_the_cli_give_exit_2_and_one_line(saved, mutations, tmp_path_factory):
    doc = copy.deepcopy(saved)
    for kind, pick, value in mutations:
        doc = _mutate(doc, kind, pick, value)
    folder = Path(tmp_path_factory.mktemp("mutated"))
    path = folder / "result.json"
    path.write_text(json.dumps(doc))
    result = runner.invoke(app, ["report", str(path), "--html", str(folder / "r.html"), "--no-examples"])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    if result.exit_code == 0:
        assert errors == [] and (folder / "r.html").is_file()
    else:
        assert result.exit_code == 2, result.stderr
        assert len(errors) == 1 and "unexpected" not in errors[0], result.stderr
