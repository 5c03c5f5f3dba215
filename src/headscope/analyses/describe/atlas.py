"""The atlas: one versioned JSON document per model, a card per head.

Schema ``headscope-atlas/2`` (documented, with its JSON Schema, in ``docs/reference/outputs.md``):
``model``, ``layout``, ``fit`` and ``evaluation`` (what each split read), ``templates`` (name, kind,
summary), ``explained`` and ``explained_off_first`` (the model's evaluation shares with 95%
intervals), ``explained_unconditioned`` (the same with every head's pooled description, to show
what conditioning on the query's class adds), ``by_layer`` (how many heads of each dominant kind
sit in each layer), and ``heads``: per head ``layer``, ``head``, ``kv_group``, ``explained``,
``explained_off_first`` (``{value, ci_low, ci_high}``), ``first_token`` (its mean attention on the
first token), ``covered`` (its attention on the keys the description names at all, the generous
reading of "accounts for"), ``left`` (1 − explained), ``components`` (``template``, ``name``, ``weight``,
``query_class``, and ``param`` where the template has one), ``dominant``, ``dominant_kind``,
``conditioned``, ``roles`` and ``contexts`` (its top-activating evaluation windows: the strongest
key, off the first token, of its strongest queries).

Optional fields (added within ``headscope-atlas/1``: readers that do not know them lose nothing):
per head ``writes`` (what its OV circuit writes, from the weights alone: ``promotes`` and
``suppresses`` as ``{token, id, logit}``, ``copying`` and ``suppression``; or ``reason``, one line,
where ``headscope weights`` refuses the model) and ``matters`` (with ``--ablate``: ``loss_increase``
``{value, ci_low, ci_high}`` in nats per token on the evaluation windows, ``random_layer``,
``random_heads``, ``rank_in_layer`` where every head of its layer was ablated); at the top,
``writes`` and ``ablation`` (how each was measured). See :mod:`.card`.

``headscope-atlas/2`` adds, with ``describe --why``, per head ``why`` (why it attends where it
does, from ``headscope qk`` on the same windows: ``key`` and ``query``, its top sources each side as
``{source, kind, role, share, ci_low, ci_high}``, ``margin``, ``unresolved`` (null, or why its
margin is not split: then every share and interval is null), and ``reconstructed``, the explained
share of its attention rebuilt from its top k sources each side, ``{k, explained, ci_low,
ci_high}``; read with qk's rules, :mod:`headscope.analyses.qk_block`) and at the top ``why`` (what it read: ``data``, ``windows``, ``rows_per_window``, and
the decomposition's ``check``). Readers accept ``headscope-atlas/1`` documents, which have neither.

Also optional within ``/2``, the heatmaps' data: at the top ``excerpts``, one per evaluation window
(``window``, ``start``, and ``tokens``: the first token, then the excerpt's n tokens from
``start``; '' for a special token), shared by every head; per head ``excerpt``: ``index`` (the
excerpt where its attention off the first token is largest), ``off_first`` (its mean attention off
the first token there), and base64 of uint8 arrays, value × 255 rounded: ``actual`` and
``predicted`` (``[n, 1 + n]`` row-major: each excerpt query's attention on the first token and on
the excerpt's keys, and the description's prediction there) and ``explained`` (``[n]``, each
query's explained share over all its keys). :func:`excerpt_maps` decodes them.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from headscope.analyses import qk_block
from headscope.core import schemacheck
from headscope.errors import HeadscopeError, InputError
from headscope.verdicts.roles import head_roles

from .fit import MIN_CLASS_QUERIES, EvalStats, Fitted, bootstrap_pooled, bootstrap_shares
from .templates import KINDS, QUERY_CLASSES, Template, Text

SCHEMA = "headscope-atlas/2"
READABLE = ("headscope-atlas/1", SCHEMA)  # /1 has no why blocks; everything else is the same
WHY_SOURCES = 5  # sources per side kept in a head's why block
SINK_SHARE = 0.5  # "sink" only for a head that puts at least this much on the first token
# A head with less than this share of its attention off the first token has no off-first share
# (null): the ratio would be of almost nothing (0/0 for a pure sink).
OFF_FIRST_MIN = 1e-4
WEIGHT_SLACK = 1e-5  # a class's weights, each rounded to 6 digits, may sum to 1 plus rounding
POOLED_OFF_FIRST = (
    "pooled over heads: the explained attention off the first token of every head over all their "
    "attention off the first token (a head weighs by its attention there)"
)


class AtlasError(HeadscopeError):
    """headscope built an atlas that fails its own schema: a bug in headscope, not in the input."""

    exit_code = 1


def _estimate(value: float, low: float, high: float, share: bool = True) -> dict[str, float | None]:
    """``{value, ci_low, ci_high}``, rounded; NaN as null. A share is kept inside [0, 1] (float32
    attention rows sum to 1 within rounding)."""

    def clean(x: float) -> float | None:
        if x is None or not np.isfinite(x):
            return None
        return round(min(max(float(x), 0.0), 1.0) if share else float(x), 6)

    return {"value": clean(value), "ci_low": clean(low), "ci_high": clean(high)}


@dataclass
class Atlas:
    model: str
    layout: dict[str, Any]
    templates: list[dict[str, Any]]
    heads: list[dict[str, Any]]
    explained: dict[str, Any]
    explained_off_first: dict[str, Any]
    explained_unconditioned: dict[str, Any]
    fit: dict[str, Any]
    evaluation: dict[str, Any]
    covered: float | None = None
    notes: list[str] = field(default_factory=list)
    writes: dict[str, Any] | None = None  # how the heads' writes were read (see .card)
    ablation: dict[str, Any] | None = None  # how the heads were ablated (--ablate; see .card)
    why: dict[str, Any] | None = None  # what describe --why read (see set_why)
    excerpts: list[dict[str, Any]] | None = None  # the heatmaps' shared excerpts (see excerpt_maps)

    def by_layer(self) -> dict[str, dict[str, int]]:
        """Per layer, how many heads have each dominant kind (the division of labour)."""
        out: dict[str, dict[str, int]] = {}
        for head in self.heads:
            row = out.setdefault(str(head["layer"]), dict.fromkeys(KINDS, 0))
            row[head["dominant_kind"]] = row.get(head["dominant_kind"], 0) + 1
        return out

    def set_roles(self, table: pd.DataFrame) -> None:
        """Each head's roles (strongest first) from a role table (describe's own, or a scan's)."""
        if not len(table):
            return
        roles = head_roles(table)
        found = {
            (int(r.layer), int(r.head)): [x for x in [r.role, *str(r.secondary).split(";")] if x]
            for r in roles.itertuples()
        }
        for entry in self.heads:
            entry["roles"] = found.get((entry["layer"], entry["head"]), [])

    def set_why(self, found: Any) -> None:
        """Each head's why block from ``headscope qk``'s result (a ``QKResult``) on the same windows."""
        by_head = {(e["layer"], e["head"]): e for e in found.heads}
        keep = ("source", "kind", "role", "share", "ci_low", "ci_high")
        for entry in self.heads:
            explained = by_head.get((entry["layer"], entry["head"]))
            if explained is None:
                continue
            entry["why"] = {
                "key": [{k: item[k] for k in keep} for item in explained["key"][:WHY_SOURCES]],
                "query": [{k: item[k] for k in keep} for item in explained["query"][:WHY_SOURCES]],
                "margin": explained["margin"],
                "unresolved": explained.get("unresolved"),
                "reconstructed": explained.get("reconstructed", []),
            }
        self.why = {
            "data": found.data,
            "windows": found.windows,
            "rows_per_window": found.rows_per_window,
            "check": found.check,
        }

    def head(self, layer: int, head: int) -> dict[str, Any]:
        for entry in self.heads:
            if entry["layer"] == layer and entry["head"] == head:
                return entry
        raise KeyError((layer, head))

    def measures(self) -> dict[str, float]:
        """Model-level numbers a sweep records by step."""
        out = {
            "explained": self.explained["value"],
            "explained_ci_low": self.explained["ci_low"],
            "explained_ci_high": self.explained["ci_high"],
            "explained_off_first": self.explained_off_first["value"],
        }
        for kind in KINDS:
            out[f"dominant_{kind}"] = float(sum(h["dominant_kind"] == kind for h in self.heads))
        return {k: v for k, v in out.items() if v is not None}

    def to_json(self) -> dict[str, Any]:
        """The atlas document, checked against its own schema (:func:`check_atlas`) before it is
        given out: an atlas that fails it is headscope's bug, said as such."""
        data = self._document()
        try:
            check_atlas(data, "the atlas headscope built")
        except InputError as exc:
            raise AtlasError(
                f"{exc.message} (a bug in headscope)", hint="please report it with the command"
            ) from None
        return data

    def _document(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model": self.model,
            "layout": self.layout,
            "fit": self.fit,
            "evaluation": self.evaluation,
            "templates": self.templates,
            "explained": self.explained,
            "explained_off_first": self.explained_off_first,
            "explained_unconditioned": self.explained_unconditioned,
            "covered": self.covered,
            "by_layer": self.by_layer(),
            "heads": self.heads,
            "notes": self.notes,
            **({"writes": self.writes} if self.writes is not None else {}),
            **({"ablation": self.ablation} if self.ablation is not None else {}),
            **({"why": self.why} if self.why is not None else {}),
            **({"excerpts": self.excerpts} if self.excerpts is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "atlas") -> Atlas:
        """An atlas read back, checked first (:func:`check_atlas`): a damaged one is refused in one
        line naming ``source`` and the JSON path."""
        check_atlas(data, source)
        keys = ("model", "layout", "templates", "heads", "explained", "explained_off_first")
        return cls(
            **{k: data[k] for k in keys},
            explained_unconditioned=data.get("explained_unconditioned", {}),
            fit=data.get("fit", {}),
            evaluation=data.get("evaluation", {}),
            covered=data.get("covered"),
            notes=list(data.get("notes", [])),
            writes=data.get("writes"),
            ablation=data.get("ablation"),
            why=data.get("why"),
            excerpts=data.get("excerpts"),
        )


# Short labels for the role map's cells ("~" marks a template, not a tested role).
_SHORT = {
    "self": "self",
    "decay": "dec",
    "broad": "brd",
    "same-token": "tok",
    "induction": "ind",
    "same-word": "wrd",
    "previous-word": "pw",
    "sentence-start": "ss",
    "line-start": "ls",
    "bracket-open": "(",
    "dep-head": "dh",
    "dep-child": "dc",
}


def grid_label(template: str) -> str:
    """``offset-1`` -> ``~-1``, ``key-class:punctuation`` -> ``~k:pu``, ``decay`` -> ``~dec``."""
    if template.startswith("offset"):
        return "~" + template[len("offset") :]
    if template.startswith("local-"):
        return "~loc" + template[len("local-") :]
    if ":" in template:
        family, label = template.split(":", 1)
        return f"~{'k' if family == 'key-class' else 'd'}:{label[:2]}"
    return "~" + _SHORT.get(template, template[:4])


def role_map_fill(atlas: Atlas, roles: dict[tuple[int, int], str], resting: str = "sink") -> dict[str, Any]:
    """What the role map shows for heads without a working role: ``sink`` only where the head puts
    at least half its attention on the first token (on evaluation text), else its dominant
    template; and the count line's words."""
    labels: dict[tuple[int, int], str] = {}
    meanings: dict[str, str] = {}
    summaries = {t["template"]: t["summary"] for t in atlas.templates}
    for head in atlas.heads:
        key = (head["layer"], head["head"])
        if roles.get(key, "") not in ("", resting):
            continue
        if head["first_token"] >= SINK_SHARE:
            labels[key] = resting
            continue
        label = grid_label(head["dominant"])
        labels[key] = label
        meanings[label] = f"{head['dominant']} ({summaries.get(head['dominant'], '')})"
    described = sum(1 for v in labels.values() if v != resting)
    line = (
        f"{described} heads without a working role are shown by their dominant template (~: fitted on "
        f"one split of the shipped texts, not a tested role); sink only where at least {SINK_SHARE:.0%} "
        f"of a head's attention is on the first token; the descriptions explain {_pct(atlas.explained)} "
        f"of all attention ({_pct(atlas.explained_off_first)} off the first token) on "
        f"{atlas.evaluation['windows']} evaluation windows"
    )
    return {"labels": labels, "meanings": meanings, "line": line}


def _pct(entry: dict[str, Any]) -> str:
    if entry.get("value") is None:
        return "none"
    if entry.get("ci_low") is None:
        return f"{entry['value']:.2f}"
    return f"{entry['value']:.2f} [{entry['ci_low']:.2f}, {entry['ci_high']:.2f}]"


def describe_components(
    components: Sequence[dict[str, Any]], digits: int = 2, fit_counts: dict[str, int] | None = None
) -> str:
    """ "0.62 sink + 0.30 offset-1" or, per class, "on punctuation: 0.7 offset-1; otherwise: …".

    With ``fit_counts`` (the atlas' ``fit.query_classes``), the classes with too few fit queries for
    a description of their own, which take the head's pooled one, are said to be "otherwise", not
    measured ("otherwise (line-start, digit: too few fit queries)")."""

    def part(items: Sequence[dict[str, Any]]) -> str:
        return " + ".join(f"{c['weight']:.{digits}f} {c['name']}" for c in items) or "nothing"

    by_class: dict[str, list[dict[str, Any]]] = {}
    for c in components:
        by_class.setdefault(c["query_class"], []).append(c)
    if list(by_class) == ["all"]:
        return part(by_class["all"])
    # Classes with the same description share one entry ("on digit, content-word: ...").
    unfitted = {c for c, n in (fit_counts or {}).items() if n < MIN_CLASS_QUERIES}
    grouped: dict[str, list[str]] = {}
    pooled: tuple[str, list[str]] | None = None
    for cls, items in by_class.items():
        if cls in unfitted:
            pooled = (part(items), [*(pooled[1] if pooled else []), cls])
        else:
            grouped.setdefault(part(items), []).append(cls)
    out = [f"on {', '.join(classes)}: {text}" for text, classes in grouped.items()]
    if pooled is not None:
        out.append(f"otherwise ({', '.join(pooled[1])}: too few fit queries): {pooled[0]}")
    return "; ".join(out)


def _components(
    weights: np.ndarray, conditioned: bool, templates: Sequence[Template]
) -> list[dict[str, Any]]:
    """``weights [C, T]`` -> the component list (one class "all" when not conditioned)."""

    def of(row: np.ndarray, query_class: str) -> list[dict[str, Any]]:
        out = []
        for t in np.argsort(-row):
            if row[t] <= 0:
                break
            entry = {
                "template": templates[t].reported,
                "name": templates[t].name,
                "weight": round(float(row[t]), 6),
                "query_class": query_class,
            }
            if templates[t].param is not None:
                entry["param"] = templates[t].param
            out.append(entry)
        return out

    if not conditioned:
        return of(weights[0], "all")
    found = []
    for c, name in enumerate(QUERY_CLASSES):
        found += of(weights[c], name)
    return found


def _contexts(
    measured: EvalStats,
    texts: Sequence[Text],
    layer: int,
    head: int,
    off_first: np.ndarray,
    n: int = 3,
    arrows: int = 5,
) -> list[dict[str, Any]]:
    """The ``n`` evaluation windows where the head's off-first-token attention is largest, each
    with its ``arrows`` strongest query -> key pairs (the strongest key off the first token)."""
    out = []
    for e in np.argsort(-off_first)[:n]:
        text = texts[int(e)]
        keys = measured.strongest[int(e)][layer, head].numpy()
        weights = measured.strongest_weight[int(e)][layer, head].float().numpy()
        real = text.content.copy()
        real[0] = False
        order = [q for q in np.argsort(-weights) if real[q]][:arrows]
        out.append(
            {
                "window": text.name,
                "off_first": round(float(off_first[int(e)]), 4),
                "arrows": [
                    {
                        "query": int(q),
                        "key": int(keys[q]),
                        "weight": round(float(weights[q]), 4),
                        "query_token": text.pieces[q],
                        "key_token": text.pieces[int(keys[q])] if 0 <= keys[q] < len(text) else "",
                        "before": "".join(text.pieces[max(1, int(keys[q]) - 6) : int(keys[q])]),
                        "between": "".join(text.pieces[int(keys[q]) + 1 : q])[-60:],
                    }
                    for q in order
                ],
            }
        )
    return out


def build_atlas(
    loaded: Any,
    templates: Sequence[Template],
    fitted: Fitted,
    measured: EvalStats,
    *,
    fit_texts: Sequence[Text],
    eval_texts: Sequence[Text],
    eval_from: str,
    n_resamples: int,
    seed: int,
) -> Atlas:
    layout = loaded.layout
    explained, ex_low, ex_high, model_ex, model_ex_ci = bootstrap_shares(
        measured.explained, measured.counts, n_resamples, seed
    )
    off, off_low, off_high, _, _ = bootstrap_shares(
        measured.off_explained, measured.off_total, n_resamples, seed
    )
    # The model's off-first share pools the heads (a ratio of sums, as each head's is over its
    # queries): a head weighs by its attention off the first token, so a sink head, which has
    # almost none, neither drags the figure to 0 nor counts as a head explained.
    model_off, model_off_ci = bootstrap_pooled(measured.off_explained, measured.off_total, n_resamples, seed)
    off_share = measured.off_total.sum(0).numpy() / max(float(measured.counts.sum()), 1e-12)
    no_off = off_share < OFF_FIRST_MIN  # [L, H]: no attention off the first token to explain
    plain, _, _, model_plain, model_plain_ci = bootstrap_shares(
        measured.explained_plain, measured.counts, n_resamples, seed
    )
    first = measured.first.sum(0).numpy() / max(float(measured.counts.sum()), 1e-12)
    covered = measured.covered.sum(0).numpy() / max(float(measured.counts.sum()), 1e-12)
    counts = measured.counts.numpy()
    weights = fitted.weights.numpy()
    class_share = fitted.class_counts.numpy() / max(float(fitted.class_counts.sum()), 1e-12)
    heads = []
    for layer in range(layout.n_layers):
        for head in range(layout.n_heads):
            w = weights[layer, head]  # [C, T]
            conditioned = bool(fitted.conditioned[layer, head])
            mean_w = class_share @ w
            top = int(np.argmax(mean_w))
            dominant = templates[top].reported if mean_w[top] > 0 else "none"
            kind = templates[top].kind if mean_w[top] > 0 else "other"
            if dominant == "sink" and first[layer, head] < SINK_SHARE:
                # The first token is its largest single target but not most of its attention: name
                # the strongest template off the first token beside it.
                others = [t for t in np.argsort(-mean_w) if templates[t].reported != "sink" and mean_w[t] > 0]
                if others:
                    dominant, kind = templates[others[0]].reported, templates[others[0]].kind
            per_window_off = 1.0 - measured.first[:, layer, head].numpy() / np.maximum(counts, 1e-12)
            heads.append(
                {
                    "layer": layer,
                    "head": head,
                    "kv_group": int(layout.kv_group(head)),
                    "explained": _estimate(explained[layer, head], ex_low[layer, head], ex_high[layer, head]),
                    "explained_off_first": _estimate(math.nan, math.nan, math.nan)
                    if no_off[layer, head]
                    else _estimate(off[layer, head], off_low[layer, head], off_high[layer, head]),
                    "explained_unconditioned": _share(plain[layer, head]),
                    "first_token": _share(first[layer, head]),
                    "covered": _share(covered[layer, head]),
                    "left": _share(1 - explained[layer, head]),
                    "components": _components(w, conditioned, templates),
                    "dominant": dominant,
                    "dominant_kind": kind,
                    "conditioned": conditioned,
                    "roles": [],
                    "contexts": _contexts(measured, eval_texts, layer, head, per_window_off),
                    **_excerpt(measured, layer, head),
                }
            )
    notes = []
    used = {t.name for t in templates}
    if not any(t.heads is not None for t in eval_texts) and {"dep-head", "dep-child"} & used:
        notes.append(
            "describe: the evaluation texts have no parse, so dep-head and dep-child say nothing there"
        )
    return Atlas(
        model=loaded.name,
        layout={
            "layers": layout.n_layers,
            "heads": layout.n_heads,
            "kv_heads": layout.n_kv_heads,
            "causal": bool(loaded.is_causal),
        },
        templates=[
            {"name": t.name, "template": t.reported, "kind": t.kind, "summary": t.summary, "param": t.param}
            for t in templates
        ],
        heads=heads,
        explained={**_estimate(model_ex, *model_ex_ci), "pooling": "mean over heads"},
        explained_off_first={
            **_estimate(model_off, *model_off_ci),
            "pooling": POOLED_OFF_FIRST,
            "heads_without": int(no_off.sum()),
        },
        explained_unconditioned={**_estimate(model_plain, *model_plain_ci), "pooling": "mean over heads"},
        covered=round(float(covered.mean()), 6),
        fit={
            "windows": len(fit_texts),
            "tokens": int(sum(len(t) for t in fit_texts)),
            "sources": sorted({t.name.split("#")[0] for t in fit_texts}),
            "query_classes": {
                c: int(n) for c, n in zip(QUERY_CLASSES, fitted.class_counts.tolist(), strict=True)
            },
        },
        evaluation={
            "from": eval_from,
            "windows": len(eval_texts),
            "tokens": int(sum(len(t) for t in eval_texts)),
            "queries": int(measured.counts.sum()),
            "sources": sorted({t.name.split("#")[0] for t in eval_texts}),
            "resamples": n_resamples,
            "interval": "95% bootstrap over evaluation windows",
        },
        notes=notes,
        excerpts=_excerpts(measured, eval_texts),
    )


def _uint8(values: Any) -> str:
    """base64 of ``values`` (shares in [0, 1]) as uint8, value × 255 rounded, row-major."""
    array = np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0)
    return base64.b64encode(np.rint(array * 255).astype(np.uint8).tobytes()).decode("ascii")


def _excerpts(measured: EvalStats, texts: Sequence[Text]) -> list[dict[str, Any]] | None:
    if measured.excerpts is None:
        return None
    return [
        {"window": text.name, "start": start, "tokens": [text.pieces[0], *text.pieces[start:stop]]}
        for text, (start, stop) in zip(texts, measured.excerpts.spans, strict=True)
    ]


def _excerpt(measured: EvalStats, layer: int, head: int) -> dict[str, Any]:
    """The head's ``excerpt`` field: the excerpt where its attention off the first token is largest
    (mean over the excerpt's queries), its two maps and its queries' explained shares."""
    if measured.excerpts is None:
        return {}
    sizes = [stop - start for start, stop in measured.excerpts.spans]
    off = measured.excerpt_off_first[:, layer, head].numpy() / np.maximum(sizes, 1)
    best = int(np.argmax(off))
    return {
        "excerpt": {
            "index": best,
            "off_first": _share(off[best]),
            "actual": _uint8(measured.excerpt_actual[best][layer, head].float().numpy()),
            "predicted": _uint8(measured.excerpt_predicted[best][layer, head].float().numpy()),
            "explained": _uint8(measured.excerpt_explained[best][layer, head].numpy()),
        }
    }


def excerpt_maps(excerpts: list[dict[str, Any]] | None, head: dict[str, Any]) -> dict[str, Any] | None:
    """A head's heatmaps decoded: ``tokens`` (the first token, then the excerpt's n), ``actual`` and
    ``predicted`` (``[n, 1 + n]`` float arrays in [0, 1], on the uint8 grid), ``explained``
    (``[n]``), ``window``, ``start`` and ``off_first``; None for an atlas written without them.
    ``excerpts``: the atlas' (``Atlas.excerpts``, or its JSON's ``excerpts``)."""
    entry = head.get("excerpt")
    if entry is None or not excerpts:
        return None
    shared = excerpts[entry["index"]]
    n = len(shared["tokens"]) - 1

    def decode(text: str, shape: tuple[int, ...]) -> np.ndarray:
        return np.frombuffer(base64.b64decode(text), dtype=np.uint8).reshape(shape) / 255.0

    return {
        "tokens": shared["tokens"],
        "window": shared["window"],
        "start": shared["start"],
        "off_first": entry["off_first"],
        "actual": decode(entry["actual"], (n, n + 1)),
        "predicted": decode(entry["predicted"], (n, n + 1)),
        "explained": decode(entry["explained"], (n,)),
    }


def _share(x: float) -> float:
    """A share rounded to 6 digits, inside [0, 1]."""
    return round(min(max(float(x), 0.0), 1.0), 6)


def _estimate_schema(description: str, share: bool = False, pooled: bool = False) -> dict[str, Any]:
    number: dict[str, Any] = {"type": ["number", "null"]}
    if share:
        number = {**number, "minimum": 0, "maximum": 1}
    properties: dict[str, Any] = {"value": number, "ci_low": number, "ci_high": number}
    if pooled:
        properties["pooling"] = {"type": "string", "description": "how the heads' figures make the model's"}
        properties["heads_without"] = {
            "type": "integer",
            "minimum": 0,
            "description": "heads with no share of their own here (null: no attention off the first token)",
        }
    return {
        "type": "object",
        "description": description,
        "required": ["value", "ci_low", "ci_high"],
        "properties": properties,
    }


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the atlas (``headscope-atlas/2``; it reads /1 too), as documented in
    docs/reference/outputs.md."""
    component = {
        "type": "object",
        "required": ["template", "name", "weight", "query_class"],
        "properties": {
            "template": {
                "type": "string",
                "description": "the template's family name (decay for every rate)",
            },
            "name": {"type": "string", "description": "the template's own name (decay-0.8)"},
            "weight": {"type": "number", "minimum": 0, "maximum": 1},
            "query_class": {"enum": ["all", *QUERY_CLASSES]},
            "param": {"type": ["number", "null"]},
        },
    }
    arrow = {
        "type": "object",
        "required": ["query", "key", "weight", "query_token", "key_token"],
        "properties": {
            "query": {"type": "integer"},
            "key": {"type": "integer"},
            "weight": {"type": "number"},
            "query_token": {"type": "string"},
            "key_token": {"type": "string"},
            "before": {"type": "string"},
            "between": {"type": "string"},
        },
    }
    token = {
        "type": "object",
        "required": ["token", "id", "logit"],
        "properties": {
            "token": {"type": "string", "description": "the token, decoded"},
            "id": {"type": "integer", "minimum": 0},
            "logit": {
                "type": "number",
                "description": "in the head's mean write, centred over the vocabulary",
            },
        },
    }
    share = {"type": "number", "minimum": 0, "maximum": 1}
    writes = {
        "type": "object",
        "description": "what the head's OV circuit writes, from the weights alone; or why it was not read",
        "oneOf": [
            {"required": ["reason"], "properties": {"reason": {"type": "string"}}},
            {"required": ["promotes", "suppresses", "copying", "suppression"]},
        ],
        "properties": {
            "promotes": {"type": "array", "items": token},
            "suppresses": {"type": "array", "items": token},
            "copying": share,
            "suppression": share,
            "reason": {"type": "string"},
        },
    }
    matters = {
        "type": "object",
        "description": "mean ablation of this head alone on the evaluation windows (--ablate)",
        "required": ["loss_increase", "random_layer", "random_heads"],
        "properties": {
            "loss_increase": _estimate_schema("ablated minus clean next-token loss, nats per token"),
            "random_layer": {"type": ["number", "null"]},
            "random_heads": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
            },
            "rank_in_layer": {"type": "integer", "minimum": 1},
            "no_interval": {"type": "string", "description": "why loss_increase has no interval"},
        },
    }
    why = {
        "type": "object",
        "description": "describe --why: the sources of the head's queries and keys (headscope qk); "
        "a resolved head's margin is above 0, an unresolved one's shares are null",
        "required": ["key", "query", "margin"],
        "properties": {
            "key": {"type": "array", "items": qk_block.SOURCE},
            "query": {"type": "array", "items": qk_block.SOURCE},
            "margin": {"type": "number"},
            "unresolved": qk_block.UNRESOLVED,
            "reconstructed": {"type": "array", "items": qk_block.RECONSTRUCTED},
        },
    }
    head = {
        "type": "object",
        "required": [
            "layer",
            "head",
            "kv_group",
            "explained",
            "explained_off_first",
            "first_token",
            "covered",
            "left",
            "components",
            "dominant",
            "dominant_kind",
            "conditioned",
            "roles",
            "contexts",
        ],
        "properties": {
            "layer": {"type": "integer", "minimum": 0},
            "head": {"type": "integer", "minimum": 0},
            "kv_group": {"type": "integer", "minimum": 0},
            "explained": _estimate_schema(
                "mean over queries of sum_k min(A, P), evaluation text", share=True
            ),
            "explained_off_first": _estimate_schema(
                "sum_q sum_{k>=1} min(A, P) / sum_q sum_{k>=1} A; null where less than "
                f"{OFF_FIRST_MIN:g} of the head's attention is off the first token (nothing to explain)",
                share=True,
            ),
            "explained_unconditioned": share,
            "first_token": share,
            "covered": share,
            "left": share,
            "components": {"type": "array", "items": component},
            "dominant": {"type": "string"},
            "dominant_kind": {"enum": list(KINDS)},
            "conditioned": {"type": "boolean"},
            "roles": {"type": "array", "items": {"type": "string"}},
            "contexts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["window", "off_first", "arrows"],
                    "properties": {
                        "window": {"type": "string"},
                        "off_first": share,
                        "arrows": {"type": "array", "items": arrow},
                    },
                },
            },
            "writes": writes,
            "matters": matters,
            "why": why,
            "excerpt": {
                "type": "object",
                "description": "the card's heatmaps: the excerpt where the head's attention off the first "
                "token is largest; maps as base64 of uint8 (value x 255), row-major",
                "required": ["index", "off_first", "actual", "predicted", "explained"],
                "properties": {
                    "index": {"type": "integer", "minimum": 0, "description": "into the top-level excerpts"},
                    "off_first": share,
                    "actual": {
                        "type": "string",
                        "description": "[n, 1 + n]: attention on the first token, then the excerpt's keys",
                    },
                    "predicted": {
                        "type": "string",
                        "description": "[n, 1 + n]: the description's prediction there",
                    },
                    "explained": {"type": "string", "description": "[n]: each query's explained share"},
                },
            },
        },
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://headscope.invalid/schemas/headscope-atlas-2.json",
        "title": "headscope atlas",
        "type": "object",
        "required": [
            "schema",
            "model",
            "layout",
            "fit",
            "evaluation",
            "templates",
            "explained",
            "explained_off_first",
            "by_layer",
            "heads",
        ],
        "properties": {
            "schema": {"enum": list(READABLE)},
            "model": {"type": "string"},
            "layout": {
                "type": "object",
                "required": ["layers", "heads", "kv_heads", "causal"],
                "properties": {
                    "layers": {"type": "integer", "minimum": 1},
                    "heads": {"type": "integer", "minimum": 1},
                    "kv_heads": {"type": "integer", "minimum": 1},
                    "causal": {"type": "boolean"},
                },
            },
            "fit": {"type": "object", "required": ["windows", "tokens", "sources"]},
            "evaluation": {"type": "object", "required": ["from", "windows", "tokens", "queries", "sources"]},
            "templates": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "template", "kind", "summary"],
                    "properties": {"kind": {"enum": list(KINDS)}},
                },
            },
            "explained": _estimate_schema("the model's: mean over heads", share=True, pooled=True),
            "explained_off_first": _estimate_schema(
                f"the model's: {POOLED_OFF_FIRST}", share=True, pooled=True
            ),
            "explained_unconditioned": _estimate_schema(
                "every head's pooled description, no query classes (mean over heads)", share=True, pooled=True
            ),
            "covered": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
            "by_layer": {
                "type": "object",
                "additionalProperties": {"type": "object", "additionalProperties": {"type": "integer"}},
            },
            "heads": {"type": "array", "items": head},
            "notes": {"type": "array", "items": {"type": "string"}},
            "excerpts": {
                "type": "array",
                "description": "one excerpt per evaluation window, shared by the heads' heatmaps",
                "items": {
                    "type": "object",
                    "required": ["window", "start", "tokens"],
                    "properties": {
                        "window": {"type": "string"},
                        "start": {"type": "integer", "minimum": 1},
                        "tokens": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                    },
                },
            },
            "why": {
                "type": "object",
                "description": "describe --why: what the decomposition read",
                "required": ["data", "windows", "check"],
                "properties": {
                    "data": {"type": "string"},
                    "windows": {"type": "object"},
                    "rows_per_window": {"type": ["integer", "null"]},
                    "check": {"type": "object"},
                },
            },
            "writes": {
                "type": "object",
                "required": ["tokens", "k", "embedding", "seed", "reason"],
                "properties": {
                    "tokens": {"type": ["integer", "null"]},
                    "k": {"type": "integer"},
                    "embedding": {"type": "string"},
                    "seed": {"type": "integer"},
                    "reason": {"type": ["string", "null"]},
                    "seconds": {"type": "number"},
                },
            },
            "ablation": {
                "type": "object",
                "required": ["mode", "heads", "windows", "tokens", "clean_loss"],
                "properties": {
                    "mode": {"enum": ["mean"]},
                    "heads": {"type": "integer"},
                    "windows": {"type": "integer"},
                    "tokens": {"type": "integer"},
                    "clean_loss": {"type": "number"},
                },
            },
        },
    }


def check_atlas(data: Any, source: str = "atlas") -> None:
    """Refuse, in one line naming ``source`` and the JSON path, an atlas that does not fit
    :func:`json_schema`, or breaks what a schema cannot say: every head of the layout exactly once
    (layer and head inside it, KV group inside its KV heads), and each query class's weights
    summing to at most 1."""
    try:
        atlas_problems(data)
    except schemacheck.SchemaProblem as problem:
        where = "" if problem.where == "the document" else f"{problem.where}: "
        raise InputError(f"{source}: {where}{problem.problem}", hint=ATLAS_HINT) from None


ATLAS_HINT = "give the atlas as headscope describe wrote it, or rerun describe"


def atlas_problems(data: Any) -> None:
    """:func:`check_atlas`'s checks, raising :class:`~headscope.core.schemacheck.SchemaProblem` at
    the first (for a reader that names the place itself: the result document's ``atlas``)."""
    if not isinstance(data, dict):
        raise schemacheck.SchemaProblem(
            "the document", f"not an atlas (a JSON object), got {type(data).__name__}"
        )
    if data.get("schema") not in READABLE:
        raise schemacheck.SchemaProblem(
            "schema",
            f"{data.get('schema')!r} is not an atlas this headscope reads ({' or '.join(READABLE)}); "
            "a newer one needs a newer headscope",
        )
    schemacheck.check(json_schema(), data)
    _check_heads(data)


def _check_heads(data: dict[str, Any]) -> None:
    layout = data["layout"]
    layers, n_heads, kv_heads = layout["layers"], layout["heads"], layout["kv_heads"]
    if kv_heads > n_heads:
        raise schemacheck.SchemaProblem("layout.kv_heads", f"{kv_heads} is more than the {n_heads} heads")
    seen: dict[tuple[int, int], int] = {}
    for index, head in enumerate(data["heads"]):
        where = f"heads[{index}]"
        key = (head["layer"], head["head"])
        if key[0] >= layers:
            raise schemacheck.SchemaProblem(f"{where}.layer", f"{key[0]} is outside the {layers} layers")
        if key[1] >= n_heads:
            raise schemacheck.SchemaProblem(f"{where}.head", f"{key[1]} is outside the {n_heads} heads")
        if head["kv_group"] >= kv_heads:
            raise schemacheck.SchemaProblem(
                f"{where}.kv_group", f"{head['kv_group']} is outside the {kv_heads} KV heads"
            )
        if key in seen:
            raise schemacheck.SchemaProblem(where, f"L{key[0]}H{key[1]} again (heads[{seen[key]}])")
        seen[key] = index
        if "excerpt" in head:
            _check_excerpt(where, head["excerpt"], data.get("excerpts") or [])
        if "why" in head:  # qk's rules for a head's explanation (its top sources only)
            qk_block.explanation_problems(f"{where}.why", head["why"], every_source=False)
        totals: dict[str, float] = {}
        for component in head["components"]:
            totals[component["query_class"]] = totals.get(component["query_class"], 0.0) + component["weight"]
        for query_class, total in totals.items():
            if total > 1 + WEIGHT_SLACK:
                raise schemacheck.SchemaProblem(
                    f"{where}.components",
                    f"the weights for query class {query_class!r} sum to {total:.6g}, more than 1",
                )
    if len(seen) != layers * n_heads:
        missing = next(
            (layer, h) for layer in range(layers) for h in range(n_heads) if (layer, h) not in seen
        )
        raise schemacheck.SchemaProblem(
            "heads",
            f"{len(seen)} heads for a layout of {layers} x {n_heads}: L{missing[0]}H{missing[1]} and "
            f"{layers * n_heads - len(seen) - 1} more have no card",
        )


def _check_excerpt(where: str, entry: dict[str, Any], excerpts: list[dict[str, Any]]) -> None:
    """A head's heatmaps point at an excerpt the atlas has, and hold that excerpt's cells."""
    if entry["index"] >= len(excerpts):
        raise schemacheck.SchemaProblem(
            f"{where}.excerpt.index", f"{entry['index']} is outside the atlas's {len(excerpts)} excerpts"
        )
    n = len(excerpts[entry["index"]]["tokens"]) - 1
    for name, size in (("actual", n * (n + 1)), ("predicted", n * (n + 1)), ("explained", n)):
        try:
            got = len(base64.b64decode(entry[name], validate=True))
        except ValueError:
            raise schemacheck.SchemaProblem(f"{where}.excerpt.{name}", "is not base64") from None
        if got != size:
            raise schemacheck.SchemaProblem(
                f"{where}.excerpt.{name}", f"{got} bytes for an excerpt of {n} tokens (expected {size})"
            )


def mixture(head: dict[str, Any], class_share: dict[str, float] | None = None) -> dict[str, float]:
    """A head's description as one weight per template name, its query classes averaged by how
    often each class occurs (equally when ``class_share`` is not given)."""
    classes = {c["query_class"] for c in head["components"]}
    out: dict[str, float] = {}
    for c in head["components"]:
        if c["query_class"] == "all":
            share = 1.0
        elif class_share:
            share = class_share.get(c["query_class"], 0.0)
        else:
            share = 1.0 / len(classes)
        out[c["name"]] = out.get(c["name"], 0.0) + share * c["weight"]
    return out


def class_shares(atlas: Atlas) -> dict[str, float]:
    """How often each query class occurs on the atlas' fit split (what weighs a head's classes)."""
    counts = atlas.fit.get("query_classes") or {}
    total = sum(counts.values()) or 1
    return {k: v / total for k, v in counts.items()}


def description_distance(
    head_a: dict[str, Any], head_b: dict[str, Any], share_a: dict[str, float], share_b: dict[str, float]
) -> float:
    """How far apart two heads' descriptions are: the total variation between their mixtures
    (½ Σ |w_a − w_b| over template names; 0 the same, 1 nothing in common)."""
    mix_a, mix_b = mixture(head_a, share_a), mixture(head_b, share_b)
    return 0.5 * sum(abs(mix_a.get(t, 0.0) - mix_b.get(t, 0.0)) for t in set(mix_a) | set(mix_b))


def nearest_heads(a: Atlas, b: Atlas) -> dict[tuple[int, int], tuple[dict[str, Any], float]]:
    """For each head of ``a``, the head of ``b`` (any layout) whose description is closest
    (:func:`description_distance`; ties: the nearer relative depth, then the lower index), and
    that distance."""
    share_a, share_b = class_shares(a), class_shares(b)
    depth_a, depth_b = max(a.layout["layers"] - 1, 1), max(b.layout["layers"] - 1, 1)
    out = {}
    for head_a in a.heads:
        best = min(
            b.heads,
            key=lambda h: (
                round(description_distance(head_a, h, share_a, share_b), 9),
                abs(head_a["layer"] / depth_a - h["layer"] / depth_b),
                h["layer"],
                h["head"],
            ),
        )
        out[(head_a["layer"], head_a["head"])] = (
            best,
            round(description_distance(head_a, best, share_a, share_b), 4),
        )
    return out


def compare_atlases(a: Atlas, b: Atlas, threshold: float = 0.25) -> list[dict[str, Any]]:
    """The heads whose description changed from ``a`` to ``b``: another dominant template, or
    mixtures at least ``threshold`` apart in total variation (½ Σ |w_a − w_b| over templates).
    Atlases of different layouts are refused."""
    from headscope.errors import InputError

    shape_a = (a.layout.get("layers"), a.layout.get("heads"))
    shape_b = (b.layout.get("layers"), b.layout.get("heads"))
    if shape_a != shape_b:
        raise InputError(
            f"the atlases have different layouts: {shape_a[0]} layers x {shape_a[1]} heads against "
            f"{shape_b[0]} x {shape_b[1]}",
            hint="compare checkpoints or fine-tunes of one architecture",
        )

    share_a, share_b = class_shares(a), class_shares(b)
    changed = []
    for head_a in a.heads:
        head_b = b.head(head_a["layer"], head_a["head"])
        distance = description_distance(head_a, head_b, share_a, share_b)
        if head_a["dominant"] != head_b["dominant"] or distance >= threshold:
            changed.append(
                {
                    "layer": head_a["layer"],
                    "head": head_a["head"],
                    "dominant_a": head_a["dominant"],
                    "dominant_b": head_b["dominant"],
                    "distance": round(distance, 4),
                    "explained_a": head_a["explained"]["value"],
                    "explained_b": head_b["explained"]["value"],
                    "description_a": describe_components(
                        head_a["components"], fit_counts=a.fit.get("query_classes")
                    ),
                    "description_b": describe_components(
                        head_b["components"], fit_counts=b.fit.get("query_classes")
                    ),
                }
            )
    return sorted(changed, key=lambda row: -row["distance"])
