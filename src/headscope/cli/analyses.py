"""The analysis commands: each is its options plus one call of the API (:func:`common.run_analysis`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from headscope import files
from headscope.analyses.coref import CorefOptions
from headscope.analyses.induction import InductionOptions
from headscope.analyses.ioi import IOIOptions
from headscope.analyses.kvplan import KVPlanOptions
from headscope.analyses.retrieval import RetrievalOptions
from headscope.analyses.scan import ScanOptions
from headscope.analyses.syntax import SyntaxOptions
from headscope.analyses.weights import WeightsOptions
from headscope.errors import InputError

from .common import (
    DEFAULT_MODEL,
    Capture,
    Csv,
    Emit,
    Load,
    ModelArg,
    Top,
    app,
    check_outputs,
    command_line,
    err,
    handle_errors,
    run_analysis,
    write_html,
    wrote,
)
from .params import command

# --- analyses ----------------------------------------------------------------------------------------


@command(app)
def scan(
    model: ModelArg = DEFAULT_MODEL,
    *,
    options: ScanOptions,
    top: Top,
    csv: Csv,
    roles_csv: Annotated[
        Path | None,
        typer.Option("--roles-csv", help="Write one row per head: its role and the score behind it."),
    ] = None,
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Write a self-contained HTML report (role map, head panels, tables)."),
    ] = None,
    emit: Emit,
    load: Load,
    capture: Capture,
) -> None:
    """Score every head with every detector, print the top heads of each and the role map."""

    def after(result: Any) -> None:
        if roles_csv is not None:
            wrote(files.write_atomic(roles_csv, result.to_csv(roles=True), "--roles-csv", emit.force))
        if html is not None:
            write_html(html, result.html(command=command_line()), emit.force)

    run_analysis(
        "scan",
        model,
        options,
        load,
        emit,
        capture=capture.capture,
        top=top.top,
        csv=csv.csv,
        outputs=(("--roles-csv", roles_csv), ("--html", html)),
        after=after,
    )


@command(app)
def induction(
    model: ModelArg = DEFAULT_MODEL,
    *,
    options: InductionOptions,
    top: Top,
    csv: Csv,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write the ablation result as JSON (atomic).")
    ] = None,
    emit: Emit,
    load: Load,
    capture: Capture,
) -> None:
    """Repeated random tokens: induction and duplicate-token heads, and loss on each copy."""

    def after(result: Any) -> None:
        if json_out is not None and result.checks:
            text = json.dumps(result.checks[0].to_json(), indent=2) + "\n"
            wrote(files.write_atomic(json_out, text, "--json", emit.force))

    if json_out is not None and not options.ablate:
        with handle_errors(emit.debug):
            check_outputs(emit.force, ("--json", json_out))
            raise InputError("--json writes the ablation result", hint="add --ablate K")
    run_analysis(
        "induction",
        model,
        options,
        load,
        emit,
        capture=capture.capture,
        top=top.top,
        csv=csv.csv,
        outputs=(("--json", json_out),),
        after=after,
    )


@command(app)
def syntax(
    model: ModelArg = DEFAULT_MODEL,
    *,
    options: SyntaxOptions,
    csv: Csv,
    emit: Emit,
    load: Load,
    capture: Capture,
) -> None:
    """Syntactic heads: per relation and direction, the best head against the best positional baseline."""
    run_analysis("syntax", model, options, load, emit, capture=capture.capture, csv=csv.csv)


@command(app)
def coref(
    model: ModelArg = DEFAULT_MODEL,
    *,
    options: CorefOptions,
    top: Top,
    csv: Csv,
    emit: Emit,
    load: Load,
    capture: Capture,
) -> None:
    """Coreference heads: does the pronoun attend most to its antecedent?"""
    run_analysis("coref", model, options, load, emit, capture=capture.capture, top=top.top, csv=csv.csv)


@command(app)
def retrieval(
    model: ModelArg = DEFAULT_MODEL,
    *,
    options: RetrievalOptions,
    png: Annotated[
        Path | None, typer.Option("--png", help="Draw needle accuracy by context and depth into this PNG.")
    ] = None,
    top: Top,
    csv: Csv,
    emit: Emit,
    load: Load,
) -> None:
    """Needle in a haystack: needle accuracy by context and depth, and the heads that copy the needle."""

    def after(result: Any) -> None:
        if png is not None:
            from headscope.outputs import views

            state = result.state
            with files.atomic_path(png, "--png", emit.force) as tmp:
                views.save_needle_png(state["needle"], tmp, f"{result.model}: {state['title']}")
            wrote(png)

    run_analysis(
        "retrieval",
        model,
        options,
        load,
        emit,
        top=top.top,
        csv=csv.csv,
        outputs=(("--png", png),),
        after=after,
    )


@command(app)
def ioi(
    model: ModelArg = DEFAULT_MODEL, *, options: IOIOptions, top: Top, csv: Csv, emit: Emit, load: Load
) -> None:
    """Indirect object identification: name movers, negative name movers and S-inhibition heads."""
    run_analysis("ioi", model, options, load, emit, top=top.top, csv=csv.csv)


@command(app, "kv-plan")
def kv_plan(
    model: ModelArg = DEFAULT_MODEL,
    *,
    options: KVPlanOptions,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write the plan into this folder: DuoAttention's full_attention_heads.tsv and config.json "
            "(and one folder per sparsity), plan.csv and curve.png.",
        ),
    ] = None,
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Write a self-contained HTML report with the KV-head grid."),
    ] = None,
    top: Top,
    csv: Csv,
    emit: Emit,
    load: Load,
) -> None:
    """A KV-cache plan: which KV heads need the whole context, which only a sink and a recent window."""
    from headscope.outputs import kvplan

    def after(result: Any) -> None:
        if out is not None:
            written = kvplan.write_plan_dir(result.kv_plan, out, emit.force)
            wrote(Path(out), f"{len(written)} files to ")
        if html is not None:
            write_html(html, result.html(command=command_line(), examples=False), emit.force)

    if out is not None:
        from headscope.analyses.kvplan import parse_sparsities

        with handle_errors(emit.debug):
            stale = kvplan.check_plan_dir(out, emit.force, parse_sparsities(str(options.sparsity)))
        for name in stale:
            err.print(
                f"note: --out {out}: {name}/ is an earlier run's plan; this run leaves it as it is",
                soft_wrap=True,
            )
    run_analysis(
        "kv-plan",
        model,
        options,
        load,
        emit,
        top=top.top,
        csv=csv.csv,
        outputs=(("--html", html),),
        after=after,
    )


@command(app, "weights")
def weights_cmd(
    model: ModelArg = DEFAULT_MODEL, *, options: WeightsOptions, top: Top, csv: Csv, emit: Emit, load: Load
) -> None:
    """Roles from the weights alone: OV copying, copy suppression and successor heads (no prompts)."""
    run_analysis("weights", model, options, load, emit, top=top.top, csv=csv.csv)
