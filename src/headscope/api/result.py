"""``Result``: what every analysis of the Python API returns, and what the CLI renders.

A result holds the tidy table (the CSV's columns), the role of every head, the verification
outcomes, and, while the model is still at hand, enough to verify and to draw attention heatmaps.
It writes itself as CSV, JSON (the same document as ``--format json``) and a self-contained HTML
report, shows that report inline in Jupyter (no CDN, nothing fetched), and reads a saved JSON back.
"""

from __future__ import annotations

import html as _html
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from headscope.errors import InputError, RunFailure
from headscope.outputs.schema import (  # noqa: F401 (the schema's names, importable from here too)
    HINT,
    MAX_HEADS,
    RESULT_FORMAT,
    RESULT_SCHEMA,
    check_result,
)
from headscope.outputs.schema import elide as _elide
from headscope.verdicts.results import CSV_COLUMNS
from headscope.verdicts.roles import ROLES_CSV_COLUMNS

GROUP = ["data", "detector", "relation", "direction"]


class Result:
    """The outcome of one analysis. Build it with ``hs.scan(...)`` and friends, or ``Result.from_json``.

    * ``table``: one row per head per (data, detector, relation, direction), the CSV's columns;
    * ``roles``: one row per head, its strongest role, secondary roles, the score and interval;
    * ``scores(detector, ...)``: a ``[n_layers, n_heads]`` array (TransformerLens ``detect_head`` style);
    * ``top(detector, k)``: the k best heads of one table;
    * ``checks`` and ``verify(k=...)``: causal checks by ablation;
    * ``to_csv``, ``to_json``, ``from_json``, ``to_html`` and inline display in Jupyter.
    """

    def __init__(
        self,
        analysis: str,
        *,
        outcome: Any = None,
        options: Any = None,
        loaded: Any = None,
        saved: dict[str, Any] | None = None,
    ) -> None:
        self.analysis = analysis
        self._outcome = outcome
        self._options = options
        self._loaded = loaded
        self._saved = saved
        self._examples: list[dict[str, Any]] | None = None
        self._read_notes: list[str] = []  # what reading a saved result noted (a newer writer)
        self.beside: Result | None = None  # another result drawn beside this one (html(beside=...))
        # hs.run(..., profile=True): the cost ledger (headscope.capture.ledger.Profile); else None
        self.profile: Any = None

    # --- what it holds ----------------------------------------------------------------------------

    @property
    def report(self) -> Any:
        """The core report (sections, notes, outcomes); None for a result read from JSON."""
        return None if self._outcome is None else self._outcome.report

    @property
    def model(self) -> str:
        return self.report.model if self.report is not None else str(self._saved.get("model", ""))  # type: ignore[union-attr]

    @property
    def notes(self) -> list[str]:
        if self.report is not None:
            return list(self.report.notes)
        return [*(self._saved.get("notes") or []), *self._read_notes]  # type: ignore[union-attr]

    @property
    def state(self) -> dict[str, Any]:
        """What the analysis kept for its verification and rendering (the needle outcome, the role rule…)."""
        return {} if self._outcome is None else self._outcome.state

    @property
    def options(self) -> Any:
        return self._options

    @property
    def layout(self) -> dict[str, Any] | None:
        """layers, heads, kv_heads, … as in the JSON's ``layout``."""
        if self.report is not None and self.report.layout is not None:
            from headscope.outputs.schema import layout_json

            return layout_json(self.report.layout)
        return None if self._saved is None else self._saved.get("layout")

    @property
    def table(self) -> pd.DataFrame:
        """The tidy table with the CSV's columns (a copy)."""
        if self.report is not None:
            return self.report.table[CSV_COLUMNS].reset_index(drop=True).copy()
        rows = pd.DataFrame(self._saved.get("rows", []))  # type: ignore[union-attr]
        for column in CSV_COLUMNS:
            if column not in rows:
                rows[column] = np.nan
        for column in ("relation", "direction", "role", "data"):
            rows[column] = rows[column].fillna("")
        for column in ("score", "baseline", "ci_low", "ci_high"):  # null in JSON is NaN here
            rows[column] = pd.to_numeric(rows[column], errors="coerce").astype(float)
        return rows[CSV_COLUMNS]

    @property
    def roles(self) -> pd.DataFrame:
        """One row per head: role (strongest), secondary roles, and the score and interval behind it."""
        if self.report is not None:
            from headscope.verdicts.roles import head_roles

            return head_roles(self.report.table)[ROLES_CSV_COLUMNS]
        saved = self._saved.get("roles") if self._saved else None
        if saved is not None:
            return pd.DataFrame(saved, columns=ROLES_CSV_COLUMNS)
        from headscope.verdicts.roles import roles_from_rows

        return roles_from_rows(self.table)[ROLES_CSV_COLUMNS]

    @property
    def checks(self) -> list[Any]:
        """The causal checks run so far (``verify=True``, ``--verify``, ``--ablate`` or ``.verify()``).

        Each has ``kind`` and ``to_json()``; a result read from JSON holds their JSON records."""
        if self._outcome is not None:
            return list(self._outcome.checks)
        saved = self._saved or {}
        out: list[Any] = []
        for key in ("verification", "circuit_verification", "ablation", "kv_plan"):
            value = saved.get(key)
            if isinstance(value, list):
                out += value
            elif isinstance(value, dict):
                out.append(value)
        return out

    @property
    def kv_plan(self) -> Any:
        """``hs.kv_plan``'s plan with its verification: a ``KVPlan`` (``ranked``, ``rows``, ``sparsities``,
        ``to_json()``), its JSON record for a result read from a file, None for other analyses."""
        if self._outcome is not None:
            from headscope.analyses.kvplan import KVPlan

            return next((c.value for c in self._outcome.checks if isinstance(c.value, KVPlan)), None)
        return (self._saved or {}).get("kv_plan")

    @property
    def atlas(self) -> Any:
        """Every head's description (``hs.describe``, and ``hs.scan``'s role map): an ``Atlas`` (``heads``,
        ``explained``, ``to_json()``), live or read back from a saved result; None when the result has none."""
        if self._outcome is not None:
            return self._outcome.state.get("atlas")
        saved = (self._saved or {}).get("atlas")
        if saved is None:
            return None
        from headscope.analyses.describe.atlas import Atlas

        return Atlas.from_json(saved)

    def card(self, head: str) -> Any:
        """One head's describe card (``"L18H6"``): in Jupyter the card inline with its two heatmaps
        (``_repr_html_``); ``.maps`` holds their data, ``.html()`` the fragment. Needs an atlas
        (``hs.describe``, or ``hs.scan``'s)."""
        import re

        from headscope.analyses.describe.present import HeadCard

        atlas = self.atlas
        if atlas is None:
            raise InputError(f"{self.analysis} result has no atlas: no head cards", hint="use hs.describe")
        found = re.fullmatch(r"[Ll]([0-9]+)[Hh]([0-9]+)", head.strip()) if isinstance(head, str) else None
        if found is None:
            raise InputError(f"head {head!r}: expected a head as L<layer>H<head>, such as L18H6")
        layer, index = int(found[1]), int(found[2])
        layers, heads = atlas.layout["layers"], atlas.layout["heads"]
        if not (layer < layers and index < heads):
            raise InputError(f"head {head!r}: outside the model's {layers} layers x {heads} heads")
        return HeadCard(atlas, layer, index)

    @property
    def graph(self) -> Any:
        """``hs.graph``'s head graph: a ``GraphResult`` (``heads``, ``edges``, ``edges_table(model)``),
        live or read back from a saved result; None for other analyses."""
        if self._outcome is not None:
            return self._outcome.state.get("graph")
        saved = (self._saved or {}).get("graph")
        if saved is None:
            return None
        from headscope.analyses.graph import GraphResult

        return GraphResult.from_json(saved)

    @property
    def qk(self) -> Any:
        """``hs.qk``'s decomposition: a ``QKResult`` (``heads``, ``check``, ``to_json()``), live or read
        back from a saved result; None for other analyses."""
        if self._outcome is not None:
            return self._outcome.state.get("qk")
        saved = (self._saved or {}).get("qk")
        if saved is None:
            return None
        from headscope.analyses.qk import QKResult

        return QKResult.from_json(saved)

    def tables(self) -> pd.DataFrame:
        """The (data, detector, relation, direction) groups of the table, one row each, with head counts."""
        table = self.table
        return table.groupby(GROUP, sort=False).size().rename("heads").reset_index()

    def _group(
        self, detector: str, relation: str | None, direction: str | None, data: str | None
    ) -> pd.DataFrame:
        for name, value in (
            ("detector", detector),
            ("relation", relation),
            ("direction", direction),
            ("data", data),
        ):
            if (value is not None or name == "detector") and not isinstance(value, str):
                raise InputError(
                    f"{name}={value!r} must be a table's name (a string)", hint="see result.table"
                )
        table = self.table
        rows = table[table.detector == detector]
        if rows.empty:
            known = ", ".join(dict.fromkeys(table.detector)) or "none"
            raise InputError(f"no table for detector {detector!r} in this result", hint=f"detectors: {known}")
        for column, value in (("relation", relation), ("direction", direction), ("data", data)):
            if value is not None:
                rows = rows[rows[column] == value]
        groups = rows[GROUP].drop_duplicates()
        if len(groups) == 0:
            raise InputError(
                f"no {detector} table matches relation={relation!r}, direction={direction!r}, data={data!r}"
            )
        if len(groups) > 1:
            listed = "; ".join(
                ", ".join(f"{k}={v!r}" for k, v in zip(GROUP, g, strict=True) if k != "detector" and v)
                for g in groups.itertuples(index=False, name=None)
            )
            raise InputError(
                f"{detector} has {len(groups)} tables in this result",
                hint=f"pick one with relation=, direction= or data=: {listed}",
            )
        return rows

    def scores(
        self,
        detector: str,
        relation: str | None = None,
        direction: str | None = None,
        data: str | None = None,
    ) -> np.ndarray:
        """The scores of one table as a ``[n_layers, n_heads]`` float array (NaN where a head has none)."""
        rows = self._group(detector, relation, direction, data)
        layout = self.layout
        table = self.table
        n_layers = int(layout["layers"]) if layout else int(table.layer.max()) + 1
        n_heads = int(layout["heads"]) if layout else int(table["head"].max()) + 1
        out = np.full((n_layers, n_heads), np.nan)
        out[rows.layer.astype(int).to_numpy(), rows["head"].astype(int).to_numpy()] = rows.score.astype(float)
        return out

    def top(
        self,
        detector: str,
        k: int = 10,
        relation: str | None = None,
        direction: str | None = None,
        data: str | None = None,
    ) -> pd.DataFrame:
        """The k best heads of one table, best first."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError(f"top: k={k!r} must be a whole number of heads, at least 1")
        rows = self._group(detector, relation, direction, data)
        return rows.sort_values("score", ascending=False, kind="stable").head(k).reset_index(drop=True)

    # --- verification -----------------------------------------------------------------------------

    def verify(self, k: int | None = None, progress: Any = None) -> list[Any]:
        """Run this analysis' causal check on the model it ran on (ablate the top-k heads and a
        random same-layer control), keep the checks in ``checks`` and return them."""
        if self._outcome is None or self._loaded is None:
            raise InputError(
                "this result was read from JSON and holds no model to ablate",
                hint="rerun the analysis, e.g. hs.scan(model).verify()",
            )
        from headscope import capture
        from headscope.analyses import get

        if k is not None and k < 1:
            raise InputError(f"k must be at least 1, got {k}")
        from headscope.outputs.progress import progress_option

        analysis = get(self.analysis)
        with progress_option(progress) as advance, capture.prepared(self._loaded):
            checks = analysis.verify(self._loaded, self._outcome, self._options, advance, k)
        self._outcome.checks = list(checks)
        return list(checks)

    # --- writing ----------------------------------------------------------------------------------

    def to_dict(self, command: str | None = None) -> dict[str, Any]:
        """The result JSON as a dict: the same document as ``headscope <command> --format json``."""
        if self._outcome is None:
            return dict(self._saved or {})
        from headscope.analyses import get
        from headscope.outputs.schema import jsonable, report_json, roles_records

        analysis = get(self.analysis)
        extra: dict[str, Any] = {}
        if analysis.json_roles:
            extra["roles"] = roles_records(self.report)
        extra.update(analysis.json(self._outcome))
        extra.update(self._outcome.extra_json)
        return jsonable(report_json(self.report, command or self.analysis, **extra))

    def to_json(self, path: str | Path | None = None, *, force: bool = False) -> str:
        """The result JSON; written atomically to ``path`` when given (``force`` to overwrite)."""
        text = json.dumps(self.to_dict(), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
        if path is not None:
            from headscope.files import write_atomic

            write_atomic(path, text, "path", force)
        return text

    def to_csv(self, path: str | Path | None = None, *, roles: bool = False, force: bool = False) -> str:
        """The tidy table as CSV (``roles=True``: one row per head with its role); written atomically
        to ``path`` when given."""
        from headscope.outputs.report import table_csv

        text = table_csv(self.roles, ROLES_CSV_COLUMNS) if roles else table_csv(self.table)
        if path is not None:
            from headscope.files import write_atomic

            write_atomic(path, text, "path", force)
        return text

    @classmethod
    def from_json(cls, source: str | Path | dict[str, Any], *, run: str | None = None) -> Result:
        """Read a saved result: a path (``to_json`` or ``--format json`` output, or a ``headscope
        sweep`` store with ``run`` its run key or model label), a JSON string, or a dict.

        The document is checked against the result schema first (:func:`check_result`: types,
        ranges, uniqueness, rows inside the stated layout, the versioning rule); anything that does
        not fit raises :class:`~headscope.errors.InputError` with one line naming the source and the
        JSON path. Keys this version does not know are ignored."""
        if not isinstance(source, (str, Path)):  # a dict (or anything else that is not a path)
            saved: Any = source
            name = "result"
        elif isinstance(source, Path) or not str(source).lstrip().startswith("{"):
            from headscope.sweeps.results import load_result

            name = f"{source}" if run is None else f"{source} (run {_elide(run)})"
            try:
                saved = load_result(source, run)
            except RecursionError:
                raise InputError(f"{_elide(str(source), 240)}: JSON nested too deeply", hint=HINT) from None
            except ValueError as exc:  # json's own limits (an integer of thousands of digits)
                raise InputError(
                    f"{_elide(str(source), 240)}: not valid JSON ({_elide(str(exc), 100)})"
                ) from None
            except OSError as exc:
                raise InputError(
                    f"{_elide(str(source), 240)}: cannot be read ({exc.strerror or exc})"
                ) from None
        else:
            name = "result JSON"
            try:
                saved = json.loads(str(source))
            except json.JSONDecodeError as exc:
                raise InputError(f"not a headscope result JSON: line {exc.lineno}: {exc.msg}") from None
            except RecursionError:
                raise InputError("not a headscope result JSON: nested too deeply") from None
            except ValueError as exc:
                raise InputError(f"not a headscope result JSON: {_elide(str(exc))}") from None
        if not isinstance(saved, dict) or "rows" not in saved or "command" not in saved:
            raise InputError(f"{name}: not a headscope result JSON: it has no 'rows' and 'command'")
        notes = check_result(saved, name)
        result = cls(str(saved["command"]), saved=saved)
        result._read_notes = notes
        return result

    def attach(self, loaded: Any) -> Result:
        """Give a saved result a model to draw attention heatmaps with (``to_html``); returns self."""
        self._loaded = loaded
        self._examples = None
        return self

    def html(
        self,
        *,
        examples: bool = True,
        command: str | None = None,
        notes: list[str] | None = None,
        beside: Result | None = None,
    ) -> str:
        """The self-contained HTML report (inline CSS, JS and data; nothing is fetched). ``beside``:
        another model's describe result, drawn beside this one (both describe results with an atlas;
        any other pair raises :class:`~headscope.errors.InputError`, as the page would leave one out)."""
        if beside is not None:
            self._check_beside(beside)
        self.beside = beside
        from headscope.outputs import html as page
        from headscope.outputs import report_data

        saved = self.to_dict()
        layout = saved.get("layout")
        maps: list[dict[str, Any]] = []
        if examples and self._loaded is not None:
            layout = report_data.layout_of(self._loaded)
            stated = saved.get("layout") or {}
            if self._outcome is None and (stated.get("layers"), stated.get("heads")) != (
                layout["layers"],
                layout["heads"],
            ):
                # A saved result drawn with another model: its rows would not fit the role map.
                raise InputError(
                    f"the model for the heatmaps has {layout['layers']} layers × {layout['heads']} heads; "
                    f"the result was made on {stated.get('layers')} × {stated.get('heads')}",
                    hint="give the model the result names, or leave the heatmaps out (--no-examples)",
                )
            if self._examples is None:
                from headscope import capture
                from headscope.extend.examples import attention_examples

                with capture.prepared(self._loaded):
                    self._examples = attention_examples(self._loaded)
            maps = self._examples
        # The command being run (the CLI sets it), else the Python call that made the result.
        made = (
            command
            or page.COMMAND_LINE.get()
            or report_data.python_call(self.analysis, self.model, self.options)
        )
        built = report_data.build(saved, layout=layout, examples=maps, command=made)
        # The second result's notes (its own and reading it), named, as the first's are on the page.
        beside_notes = (
            [f"the second result ({beside.analysis} of {beside.model}): {text}" for text in beside.notes]
            if beside is not None
            else []
        )
        built["notes"] += [*self._read_notes, *beside_notes, *(notes or [])]
        return page.render(built, self._html_sections())

    def _check_beside(self, beside: Result) -> None:
        """Refuse a pair of results that one page cannot hold: only an analysis that draws a second
        result beside its own (``Analysis.draws_beside``: describe) shares its page, and only with
        another result of its kind, both with an atlas. Any other pair would be drawn as the first
        alone, the second left out."""
        from headscope.analyses import ANALYSES

        kinds = [name for name in ANALYSES if ANALYSES[name].draws_beside]
        pair = f"{self.analysis} of {self.model} and {beside.analysis} of {beside.model}"
        if self.analysis not in kinds or beside.analysis != self.analysis:
            raise InputError(
                f"{pair} cannot share one page: only two {' or two '.join(kinds)} results stand side by side",
                hint="write one page per result: headscope report RESULT --html PAGE; two models side by "
                "side: headscope describe MODEL --format json -o a.json for each, then report both",
            )
        for which, result in (("the first", self), ("the second", beside)):
            if result.atlas is None:
                raise InputError(
                    f"{which} result ({result.analysis} of {result.model}) has no atlas: two results "
                    "side by side are two describe results with their atlases",
                    hint="headscope describe MODEL --format json -o a.json, for each model",
                )

    def _html_sections(self) -> list[str]:
        """The analysis' own section of the report (``Analysis.html_section``), built-in or plugin."""
        from headscope.analyses import ANALYSES

        if self.analysis not in ANALYSES:
            return []
        try:
            fragment = ANALYSES[self.analysis].html_section(self)
        except KeyError:
            if self._outcome is not None:
                raise
            fragment = None  # drawn from the live run's state, which a result read from JSON lacks
        return [fragment] if fragment else []

    def to_html(self, path: str | Path, *, examples: bool = True, force: bool = False) -> Path:
        """Write the HTML report to ``path`` atomically (with attention heatmaps while the model is at hand)."""
        from headscope.files import write_atomic

        return write_atomic(path, self.html(examples=examples), "path", force)

    def _repr_html_(self) -> str:
        """Jupyter: the report inline, in a sandboxed iframe, so its CSS and JS stay its own."""
        try:
            document = self.html()
        except (InputError, RunFailure) as exc:
            return f"<pre>{_html.escape(repr(self))}\n(report not drawn: {_html.escape(str(exc))})</pre>"
        return (
            '<iframe title="headscope report" sandbox="allow-scripts" '
            'style="width:100%;height:760px;border:1px solid #ddd;border-radius:4px" '
            f'srcdoc="{_html.escape(document, quote=True)}"></iframe>'
        )

    def __repr__(self) -> str:
        table = self.table
        layout = self.layout
        shape = f"{layout['layers']}x{layout['heads']} heads" if layout else f"{len(table)} rows"
        roles = self.roles
        working = roles[(roles.role != "") & (roles.role != "sink")]
        counts = ", ".join(f"{label} {n}" for label, n in working.role.value_counts().items())
        n_tables = len(table[GROUP].drop_duplicates())
        checks = len(self.checks)
        return (
            f"<headscope.Result {self.analysis} of {self.model}: {shape}, {n_tables} tables, "
            f"{len(working)} heads with a role{f' ({counts})' if counts else ''}; "
            f"{checks} check{'s' if checks != 1 else ''}{'' if self._loaded is not None or self._saved is None else '; from JSON'}>"
        )


class AttentionMap:
    """What ``hs.show`` returns: one layer's attention on one text, for the heads asked for.

    ``view.weights[head, query, key]``, ``labels`` (tokens or words), ``table`` (one row per
    head, query and key, as ``headscope show --format csv``), and an inline heatmap in Jupyter."""

    def __init__(self, view: Any, model: str) -> None:
        self.view = view
        self.model = model
        self.profile: Any = None  # hs.show(..., profile=True): the cost ledger

    @property
    def labels(self) -> list[str]:
        return list(self.view.labels)

    @property
    def weights(self) -> np.ndarray:
        """``[n_heads_shown, n, n]`` float array."""
        return self.view.weights.float().numpy()

    @property
    def table(self) -> pd.DataFrame:
        from headscope.outputs.views import VIEW_COLUMNS, view_rows

        return pd.DataFrame(view_rows(self.view), columns=VIEW_COLUMNS)

    def to_csv(self, path: str | Path | None = None, *, force: bool = False) -> str:
        from headscope.outputs.report import table_csv
        from headscope.outputs.views import VIEW_COLUMNS

        text = table_csv(self.table, VIEW_COLUMNS)
        if path is not None:
            from headscope.files import write_atomic

            write_atomic(path, text, "path", force)
        return text

    def _repr_html_(self) -> str:
        labels = [_html.escape(label) for label in self.view.labels]
        blocks = []
        for index, head in enumerate(self.view.heads):
            weights = self.view.weights[index]
            rows = "".join(
                f"<tr><th style='text-align:right;padding-right:4px'>{labels[q]}</th>"
                + "".join(
                    f"<td title='{labels[q]} → {labels[k]}: {float(weights[q, k]):.3f}' "
                    f"style='width:14px;height:14px;background:rgba(208,56,56,{float(weights[q, k]):.3f})'></td>"
                    for k in range(len(labels))
                )
                + "</tr>"
                for q in range(len(labels))
            )
            header = "".join(
                f"<th style='writing-mode:vertical-rl;font-weight:normal'>{label}</th>" for label in labels
            )
            blocks.append(
                f"<div style='display:inline-block;margin:0 16px 16px 0'><b>L{self.view.layer}H{head}</b>"
                f"<table style='border-collapse:collapse;font:11px sans-serif'><tr><th></th>{header}</tr>{rows}</table></div>"
            )
        return f"<div>{''.join(blocks)}</div>"

    def __repr__(self) -> str:
        heads = ",".join(str(h) for h in self.view.heads)
        return (
            f"<headscope.AttentionMap {self.model}: layer {self.view.layer}, heads {heads}, "
            f"{len(self.view.labels)} {self.view.unit}s>"
        )
