"""The data an HTML report embeds: the verdict of a scan (or any analysis) as one JSON document.

Built from a live :class:`~headscope.analyses.Report` (``scan --html``) or from a saved result
(``scan --format json`` output, ``headscope report``). Attention heatmaps of three small examples
(English prose, repeated random tokens, a Chinese sentence) are computed when the report is built,
from the model itself, and stored as one byte per weight.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from headscope import __version__
from headscope.errors import InputError

SCHEMA = "headscope-report/1"
MAX_EXAMPLE_TOKENS = 64
RESULT_KEYS = {"headscope", "command", "model", "sections", "rows"}
SHARE_RULES = {("ioi", "dla"), ("ioi", "s-inhibition")}


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) or math.isinf(number) else number


def load_result(path: str | Path, run: str | None = None) -> dict[str, Any]:
    """A saved headscope result (``--format json``), or one run of a sweep store (``run``: its key or
    model label; default the last finished run), checked: exit 2 with one line when it is not one."""
    path = Path(path).expanduser()
    if not path.exists():
        raise InputError(f"{path}: no such file", hint="give the output of headscope scan --format json")
    if path.is_dir():
        if (path / "manifest.json").is_file():
            return load_sweep_run(path, run)
        raise InputError(
            f"{path}: is a folder without a sweep manifest",
            hint="give the output of headscope scan --format json, or a headscope sweep store",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text; not a headscope result") from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); truncated?",
            hint="give the complete output of headscope scan --format json",
        ) from None
    if not isinstance(data, dict) or not set(data) >= RESULT_KEYS:
        missing = sorted(RESULT_KEYS - set(data)) if isinstance(data, dict) else sorted(RESULT_KEYS)
        raise InputError(
            f"{path}: not a headscope result (missing {', '.join(missing)})",
            hint="give the output of headscope scan --format json",
        )
    if not isinstance(data["rows"], list) or not data["rows"]:
        raise InputError(f"{path}: the result holds no head rows")
    return data


def load_sweep_run(folder: Path, run: str | None = None) -> dict[str, Any]:
    """One finished run of a ``headscope sweep`` store as a result dictionary."""
    from headscope.sweep.store import Store

    store = Store(folder)
    try:
        store.runs = dict(json.loads((folder / "manifest.json").read_text(encoding="utf-8")).get("runs", {}))
    except (OSError, ValueError, AttributeError):
        raise InputError(f"{folder / 'manifest.json'}: not a readable sweep manifest") from None
    done = {key: entry for key, entry in store.runs.items() if entry.get("status") == "done"}
    if not done:
        raise InputError(f"{folder}: the sweep store holds no finished run")
    if run is None:
        key = max(done, key=lambda k: (done[k].get("step") is not None, done[k].get("step") or 0, k))
    else:
        matches = [
            k for k, e in done.items() if run in (k, e.get("label"), f"{e.get('label')}:{e.get('analysis')}")
        ]
        if not matches:
            raise InputError(f"--run {run}: no finished run of {folder} has that key or label")
        key = matches[0]
    entry = done[key]
    if store.is_done(key, entry.get("options"), entry.get("fingerprint"))[0] is False:
        raise InputError(
            f"{folder}: run {key}'s result file does not match its checksum", hint="rerun the sweep"
        )
    payload = store.load(key)
    return {
        "headscope": entry.get("headscope", __version__),
        "command": str(entry.get("analysis", "sweep")),
        "model": entry.get("label", key),
        "spec": entry.get("spec"),
        "sections": [],
        "rows": payload["rows"],
        "notes": [f"sweep store {folder}, run {key}", *payload.get("notes", [])],
        "copy_loss": None,
        "layout": {"layers": payload.get("layers"), "heads": payload.get("heads")},
    }


def _tables(rows: pd.DataFrame, sections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    keys = ["data", "detector", "relation", "direction"]
    summaries = {tuple(s.get(k, "") for k in keys): s for s in sections}
    for index, (group, part) in enumerate(rows.groupby(keys, sort=False)):
        section = summaries.get(tuple(group), {})
        data, detector, relation, direction = group
        title = " · ".join(p for p in (data, detector, relation, direction) if p)
        signed = (detector, relation) in SHARE_RULES
        part = part.sort_values(["layer", "head"])
        out.append(
            {
                "id": f"t{index}",
                "title": title,
                "data": data,
                "detector": detector,
                "relation": relation,
                "direction": direction,
                "summary": section.get("summary", "") or section.get("description", ""),
                "baseline": _number(section.get("baseline")),
                "signed": signed,
                "rows": [
                    {
                        "layer": int(r.layer),
                        "head": int(r.head),
                        "kv_group": int(r.kv_group),
                        "score": _number(r.score),
                        "baseline": _number(r.baseline),
                        "ci_low": _number(r.ci_low),
                        "ci_high": _number(r.ci_high),
                        "n": int(r.n) if _number(r.n) is not None else 0,
                        "rank": int(r.rank) if _number(r.rank) is not None else 0,
                        "role": r.role if isinstance(r.role, str) else "",
                    }
                    for r in part.itertuples()
                ],
            }
        )
    return out


def _heads(
    rows: pd.DataFrame, roles: list[dict[str, Any]], tables: list[dict[str, Any]], layers: int, heads: int
) -> list[dict[str, Any]]:
    strongest = {(int(r["layer"]), int(r["head"])): r for r in roles}
    table_of = {(t["data"], t["detector"], t["relation"], t["direction"]): t["id"] for t in tables}
    kv = {(int(r.layer), int(r.head)): int(r.kv_group) for r in rows.itertuples()}
    held = (
        rows[rows["role"].fillna("") != ""]
        .groupby(["layer", "head"])["role"]
        .apply(lambda s: list(dict.fromkeys(s)))
    )
    out = []
    for layer in range(layers):
        for head in range(heads):
            best = strongest.get((layer, head), {})
            role = best.get("role") or ""
            all_roles = list(held.get((layer, head), []))
            key = (
                best.get("data", ""),
                best.get("detector", ""),
                best.get("relation", ""),
                best.get("direction", ""),
            )
            out.append(
                {
                    "layer": layer,
                    "head": head,
                    "kv_group": kv.get((layer, head), 0),
                    "role": role,
                    "secondary": [r for r in all_roles if r != role],
                    "score": _number(best.get("score")) if role else None,
                    "ci_low": _number(best.get("ci_low")) if role else None,
                    "ci_high": _number(best.get("ci_high")) if role else None,
                    "baseline": _number(best.get("baseline")) if role else None,
                    "table": table_of.get(key) if role else None,
                }
            )
    return out


def _summaries(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Extra results as plain tables: --verify, circuit checks, copy loss, model-level outcomes."""
    out = []
    loss = result.get("copy_loss")
    if loss:
        out.append(
            {
                "title": "next-token loss by copy of the repeated sequence",
                "columns": ["copy", "mean loss (nats)", "tokens"],
                "rows": [
                    [i + 1, v, t]
                    for i, (v, t) in enumerate(zip(loss["per_copy"], loss["tokens_per_copy"], strict=False))
                ],
            }
        )
    for key, title in (
        ("verification", "--verify: ablation of each table's top heads"),
        ("circuit_verification", "--verify: circuit checks"),
    ):
        items = result.get(key)
        if isinstance(items, list) and items:
            columns = sorted({k for item in items for k in item if not isinstance(item.get(k), (dict, list))})
            out.append(
                {
                    "title": title,
                    "columns": columns,
                    "rows": [[_cell(item.get(c)) for c in columns] for item in items],
                }
            )
    for data, outcome in (result.get("outcomes") or {}).items():
        if isinstance(outcome, dict):
            flat = {k: v for k, v in outcome.items() if not isinstance(v, (dict, list))}
            if flat:
                out.append(
                    {
                        "title": f"{data}: model-level result",
                        "columns": list(flat),
                        "rows": [[_cell(v) for v in flat.values()]],
                    }
                )
    return out


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, (int, str)) or value is None:
        return value
    return str(value)


def build(
    result: dict[str, Any],
    *,
    layout: dict[str, Any] | None = None,
    examples: list[dict[str, Any]] | None = None,
    command: str = "",
) -> dict[str, Any]:
    """The report's data from a result dictionary (``report_json`` output)."""
    from headscope.outputs.report import RELATION_NAMES, ROLE_COLORS, ROLE_MEANINGS

    rows = pd.DataFrame(result["rows"])
    for column in ("data", "detector", "relation", "direction", "role"):
        rows[column] = rows[column].fillna("").astype(str)
    layers = int(rows["layer"].max()) + 1
    heads = int(rows["head"].max()) + 1
    layout = {k: v for k, v in (layout or result.get("layout") or {}).items() if v is not None}
    local = list((result.get("layers") or {}).get("local", layout.get("local_layers", [])))
    model = {
        "name": str(result["model"]),
        "layers": int(layout.get("layers", layers)),
        "heads": int(layout.get("heads", heads)),
        "kv_heads": int(layout.get("kv_heads", int(rows["kv_group"].max()) + 1)),
        "group_size": int(layout.get("group_size", heads // (int(rows["kv_group"].max()) + 1))),
        "head_dim": int(layout.get("head_dim", 0)),
        "d_model": int(layout.get("d_model", 0)),
        "local_layers": local,
        "global_layers": [i for i in range(layers) if i not in local],
        "window": (result.get("layers") or {}).get("window", layout.get("window")),
        "causal": bool(layout.get("causal", True)),
    }
    tables = _tables(rows, result.get("sections", []))
    roles = result.get("roles")
    if roles is None:
        roles = _strongest(rows)
    used = list(dict.fromkeys(r["role"] for r in roles if r.get("role")))
    held = list(dict.fromkeys(rows.loc[rows["role"] != "", "role"]))
    labels = list(dict.fromkeys([*used, *held]))
    labels.sort(key=lambda label: (label == "sink", label))
    datasets = list(
        {
            s["data"]: {"data": s["data"], "description": s.get("description", "")}
            for s in result.get("sections", [])
        }.values()
    )
    return {
        "schema": SCHEMA,
        "title": f"headscope {result.get('command', '')} · {model['name']}",
        "model": model,
        "headscope": str(result.get("headscope", __version__)),
        "command": command or f"headscope {result.get('command', '')} {model['name']}",
        "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "datasets": datasets,
        "roles": [
            {
                "label": label,
                "meaning": ROLE_MEANINGS.get(label, RELATION_NAMES.get(label, label)),
                "color": ROLE_COLORS.get(label, "#9aa5b1"),
            }
            for label in labels
        ],
        "heads": _heads(rows, roles, tables, layers, heads),
        "tables": tables,
        "summaries": _summaries(result),
        "notes": [str(n) for n in result.get("notes", [])],
        "examples": examples or [],
    }


def _strongest(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Strongest role per head when a result carries no role table: largest share of headroom."""
    held = rows[rows["role"] != ""].copy()
    if held.empty:
        return []
    base = held["baseline"].fillna(0.0).astype(float)
    held["strength"] = (held["score"].astype(float) - base) / (1.0 - base).clip(lower=1e-9)
    held["resting"] = held["role"] == "sink"
    held = held.sort_values(["resting", "strength"], ascending=[True, False]).drop_duplicates(
        ["layer", "head"]
    )
    return held.to_dict(orient="records")


# --- attention heatmaps of three small examples ------------------------------------------------------


def attention_examples(loaded: Any, seed: int = 0) -> list[dict[str, Any]]:
    """Every head's map on English prose, repeated random tokens and a Chinese sentence."""
    import torch

    from headscope import capture
    from headscope.data.align import encode_with_offsets
    from headscope.data.prompts import builtin, load_texts
    from headscope.outputs.views import token_label

    texts = load_texts(builtin("report/examples.yaml"))
    inputs: list[tuple[str, list[int], list[bool], list[str]]] = []
    tokenizer = loaded.tokenizer
    limit = min(MAX_EXAMPLE_TOKENS, loaded.max_positions or MAX_EXAMPLE_TOKENS)
    for item in texts.items:
        ids, special, offsets = encode_with_offsets(tokenizer, item.text)
        ids, special, offsets = ids[:limit], special[:limit], offsets[:limit]
        pieces = tokenizer.convert_ids_to_tokens(ids)
        labels = [token_label(item.text, o, t, s) for o, t, s in zip(offsets, pieces, special, strict=True)]
        inputs.append(("English prose" if item.id == "english" else "Chinese sentence", ids, special, labels))
    from headscope.analyses import RepeatSpec, repeated_tokens

    half = max(2, (limit - 2) // 2)
    sequences, specials, _ = repeated_tokens(
        loaded, RepeatSpec(seq_len=min(20, half), repeats=2, n_seqs=1, seed=seed)
    )
    labels = [
        ("⟨s⟩" if s else tokenizer.convert_ids_to_tokens([i])[0])
        for i, s in zip(sequences[0], specials[0], strict=True)
    ]
    inputs.insert(1, ("repeated random tokens", sequences[0], specials[0], labels))

    layout = loaded.layout
    out = []
    for name, ids, special, labels in inputs:
        length = len(ids)
        maps = torch.zeros(layout.n_layers, layout.n_heads, length, length)

        def on_layer(
            layer: int, attn: torch.Tensor, _batch: Any, q_start: int, maps: torch.Tensor = maps
        ) -> None:
            rows = attn.shape[2]
            maps[layer, :, q_start : q_start + rows, : attn.shape[3]] = attn[0].float().cpu()

        batch = capture.make_batches([ids], [special], batch_size=1, pad_id=0, is_causal=loaded.is_causal)[0]
        capture.run(loaded, [batch], on_layer)
        quantised = np.clip(np.rint(maps.numpy() * 255.0), 0, 255).astype(np.uint8)
        encoded = {
            f"{layer},{head}": base64.b64encode(quantised[layer, head].tobytes()).decode("ascii")
            for layer in range(layout.n_layers)
            for head in range(layout.n_heads)
        }
        out.append({"name": name, "tokens": labels, "maps": encoded})
    return out


def layout_of(loaded: Any) -> dict[str, Any]:
    from headscope.outputs.report import layout_json

    return {**layout_json(loaded.layout), "causal": bool(loaded.is_causal)}
