"""Options declared once: dataclass fields become typer options, shared by every command that takes them.

A command names its option groups as parameters annotated with a dataclass; :func:`command`
replaces each such parameter by the group's fields (flag, help, range and choices come from the
field's metadata, see :func:`headscope.extend.protocol.option`; a field without a default is a
required option) and hands the command one instance of the group. So ``--device`` or
``--resamples`` is written in one place with one help text, and the analyses' options are the same
declaration the Python API reads.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import shlex
import typing
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any

import typer

from headscope.errors import HeadscopeError
from headscope.extend.protocol import check_value, default_of, flag_of
from headscope.outputs.html import COMMAND_LINE

from .common import handle_errors

KEYWORD = inspect.Parameter.KEYWORD_ONLY


@functools.cache
def _choice_enum(name: str, choices: tuple[str, ...]) -> type[Enum]:
    """typer shows and checks choices from an Enum; one per (option, choices)."""
    return Enum(name.title().replace("_", ""), {c: c for c in choices}, type=str)  # type: ignore[return-value]


def is_group(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def _parameter(field: dataclasses.Field, kind: Any) -> inspect.Parameter:
    meta = field.metadata
    annotation = meta.get("cli_type") or kind
    default = default_of(field)
    if meta.get("choices"):
        annotation = _choice_enum(field.name, tuple(meta["choices"]))
        default = annotation(default) if default is not None else None
    extra: dict[str, Any] = {k: meta[k] for k in ("min", "max") if meta.get(k) is not None}
    number = _number_kind(kind)
    if extra and number is not None:
        # typer would check the range itself, before our callback, and answer "Input should be less
        # than or equal to 1" for nan; its min and max stay for the help ("[0.0<=x<=1.0]"), and the
        # parser hands the value to check_value, which says "must be a finite number" or the range.
        extra["parser"] = _number_parser(number, optional=type(None) in typing.get_args(kind))
    flags = flag_of(field)
    names = flags if isinstance(flags, tuple) else (flags,)
    callback = None if meta.get("checked_by_api") else _callback(field, kind)
    option = typer.Option(*names, help=meta.get("help"), callback=callback, **extra)
    return inspect.Parameter(field.name, KEYWORD, default=default, annotation=Annotated[annotation, option])


def _callback(field: dataclasses.Field, kind: Any) -> Callable[[Any], Any]:
    """The option's one check (:func:`headscope.extend.protocol.check_value`: type, range, choices,
    NaN and infinity, its own ``check``), as a typer callback (usage error naming the flag, exit 2)."""

    def callback(value: Any) -> Any:
        try:
            check_value("", field, kind, _plain(value), cli=True)
        except HeadscopeError as exc:
            raise typer.BadParameter(str(exc)) from None
        return value

    return callback


def _number_kind(kind: Any) -> type | None:
    """int or float for an option of that type (or that type or None), else None."""
    members = [k for k in typing.get_args(kind) if k is not type(None)] if typing.get_args(kind) else [kind]
    return members[0] if len(members) == 1 and members[0] in (int, float) else None


def _number_parser(number: type, *, optional: bool = False) -> Callable[[Any], Any]:
    """Text to ``number`` where it reads as one (and "none" to None for an option that may be
    None, as its help says); anything else is passed on unchanged, for the callback's check to
    refuse in words ("x: expected a number")."""

    def parse(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if optional and value.strip().lower() == "none":
            return None
        try:
            return number(value)
        except ValueError:
            return value

    return parse


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


_CONTEXT = "headscope_cli_context"


def command_line(context: typer.Context) -> str:
    """The command being run, as a shell line: ``headscope scan toy --resamples 0 --html r.html``
    (its arguments, then the options given on the command line, as parsed). The HTML report records
    it; sys.argv would be another program's where the CLI runs in-process (a test runner, a notebook)."""
    words = ["headscope", *context.command_path.split()[1:]]
    options: list[str] = []
    for param in context.command.params:
        source = context.get_parameter_source(param.name)
        if param.name is None or getattr(source, "name", None) != "COMMANDLINE":
            continue
        value = context.params.get(param.name)
        values = list(value) if isinstance(value, list | tuple) else [value]
        if param.param_type_name == "argument":
            words += [str(_plain(v)) for v in values]
        elif getattr(param, "is_flag", False) and isinstance(value, bool):
            flags = param.opts if value else getattr(param, "secondary_opts", [])
            options += flags[:1]
        else:
            for item in values:
                options += [param.opts[0], str(_plain(item))]
    return " ".join(shlex.quote(word) for word in [*words, *options])


def given(context: typer.Context, group: Any) -> dict[str, Any]:
    """The fields of ``group`` the command line gave (not left at their defaults)."""
    fields = dataclasses.fields(group)
    sources = {f.name: context.get_parameter_source(f.name) for f in fields}  # typer's click: by name
    return {n: getattr(group, n) for n, s in sources.items() if s is not None and s.name != "DEFAULT"}


def command(app: typer.Typer, name: str | None = None) -> Callable[[Callable], Callable]:
    """Register ``fn`` as a command; its dataclass-annotated parameters become option groups (a
    field two groups share is declared once), each in its place among the function's parameters.
    It runs under :func:`handle_errors`, with the ``--debug`` of its groups."""

    def decorate(fn: Callable) -> Callable:
        hints = typing.get_type_hints(fn, include_extras=True)
        own: list[str] = []
        groups: dict[str, type] = {}
        params: dict[str, inspect.Parameter] = {}
        for param in inspect.signature(fn).parameters.values():
            annotation = hints.get(param.name, param.annotation)
            if not is_group(annotation):
                own.append(param.name)
                params[param.name] = param.replace(annotation=annotation)
                continue
            groups[param.name] = annotation
            kinds = typing.get_type_hints(annotation, include_extras=True)
            for field in dataclasses.fields(annotation):
                params.setdefault(field.name, _parameter(field, kinds[field.name]))
        # typer hands the command's context to the one parameter annotated typer.Context: the
        # command's own, or one added here, for the line the HTML report records.
        context = next((n for n in own if params[n].annotation is typer.Context), _CONTEXT)
        params.setdefault(context, inspect.Parameter(context, KEYWORD, annotation=typer.Context))

        @functools.wraps(fn)
        def wrapper(**kwargs: Any) -> Any:
            line = COMMAND_LINE.set(command_line(kwargs[context] if context in own else kwargs.pop(context)))
            try:
                with handle_errors(bool(kwargs.get("debug"))):
                    call = {n: kwargs[n] for n in own}
                    for group_name, group in groups.items():
                        call[group_name] = group(
                            **{f.name: _plain(kwargs[f.name]) for f in dataclasses.fields(group)}
                        )
                    return fn(**call)
            finally:
                COMMAND_LINE.reset(line)

        wrapper.__signature__ = inspect.Signature(list(params.values()))  # type: ignore[attr-defined]
        # typer reads the annotations too: resolved objects, not the strings of fn's module.
        wrapper.__annotations__ = {p.name: p.annotation for p in params.values()}
        del wrapper.__wrapped__  # typer must read the new signature, not fn's
        app.command(name)(wrapper)
        return fn

    return decorate
