"""One registry per kind of extension (detectors, analyses): built-ins, pip-installed plugins, and
what a notebook registers at run time, behind one mapping that every reader uses.

A plugin is a package that declares an entry point in the group of the kind::

    [project.entry-points."headscope.detectors"]
    closing-bracket = "headscope_brackets:CLOSING_BRACKET"

The object an entry point names is a declaration (or a list of them). Plugins load on the first
read of the registry, not when headscope is imported. A plugin that fails to import, names
something that is not a declaration, or takes a name that is already taken, is named in one
warning (:class:`PluginWarning`) and left out; it never stops the other commands (a plugin that
calls ``sys.exit`` while it imports is left out the same way; Ctrl-C still stops).

Names that headscope gives to something else (``compare``, ``sweep``: functions of the API and
commands of the CLI that are not analyses) are reserved: ``hs.register`` refuses them, a plugin
that takes one is named in a warning and left out. Every read and every registration holds one
lock, so threads registering at once, or racing the first read (which loads the plugins), never
leave two declarations of one name or one role label.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from headscope.errors import InputError

T = TypeVar("T")


class PluginWarning(UserWarning):
    """A plugin that was left out, and why (the CLI prints it as one line on stderr)."""


# ``hs.<name>`` functions that are not analyses (``hs.compare``, ``hs.plan_options``): an analysis
# of one of these names (``-`` read as ``_``) would be listed but ``hs.<name>`` never reaches it.
API_NAMES = ("compare", "load", "option", "plan", "plan_options", "register", "run", "show", "sweep")
# ``headscope <name>`` commands that are not analyses: the command wins, the analysis is never run.
CLI_COMMANDS = ("compare", "detectors", "info", "models", "report", "show", "sweep")


def reserved_analysis_name(name: str) -> str | None:
    """Why ``name`` cannot name an analysis (an API function, a CLI command, a subpackage), or None."""
    python = name.replace("-", "_")
    taken = []
    if python in API_NAMES:
        taken.append(f"hs.{python} is headscope's own function")
    if name in CLI_COMMANDS or python in CLI_COMMANDS:
        taken.append(f"`headscope {name}` is headscope's own command")
    here = Path(__file__).parent.parent  # the headscope package
    if python not in API_NAMES and ((here / python).is_dir() or (here / f"{python}.py").is_file()):
        taken.append(f"headscope.{python} is a module of headscope")
    if not taken:
        return None
    return f"{' and '.join(taken)}, not an analysis: an analysis of that name would never be reached"


# Names a registry's group cannot give, whatever declares them: group -> (name -> why or None).
RESERVED: dict[str, Callable[[str], str | None]] = {"headscope.analyses": reserved_analysis_name}


def origin_in(group: str, name: str) -> str | None:
    """Where ``name`` of the registry of ``group`` comes from (see :meth:`Registry.origin`), or None
    when it holds no such name: for messages of modules that the registry's own module imports."""
    registry = _BY_GROUP.get(group)
    return registry.origin(name) if registry is not None and name in registry else None


class _Live(Mapping[str, T], Generic[T]):
    """A mapping read live from ``_all()`` on every access (a registry, or one part of one)."""

    def _all(self) -> dict[str, T]:
        raise NotImplementedError

    def __getitem__(self, name: str) -> T:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __contains__(self, name: object) -> bool:
        return name in self._all()


class Registry(_Live[T]):
    """Name -> declaration, in order: built-ins, then plugins (by entry point), then run-time ones.

    ``accept(obj)`` returns the declaration to keep (it may instantiate a class), or raises
    TypeError/InputError saying why ``obj`` is not one; ``name_of`` reads its name.
    """

    def __init__(
        self,
        kind: str,
        group: str,
        accept: Callable[[Any], T],
        name_of: Callable[[T], str],
        clash: Callable[[T, dict[str, T]], str | None] | None = None,
        builtins_from: str | None = None,
    ) -> None:
        self.kind, self.group = kind, group
        # The module whose import registers the built-ins (``headscope.analyses``): imported on the
        # first read, before the plugins, so a reader never sees the registry without them.
        self._builtins_from = builtins_from
        self._accept, self._name_of = accept, name_of
        # clash(new, registered) -> why ``new`` cannot sit beside the others (a role label taken), or None.
        self._clash = clash or (lambda new, registered: None)
        self._builtin: dict[str, T] = {}
        self._plugins: dict[str, T] = {}
        self._runtime: dict[str, T] = {}
        self._origin: dict[str, str] = {}  # name -> the package it came from (plugins)
        self._loaded = False
        # One lock for loading, registering and reading: re-entrant, so a plugin that reads the
        # registry while it imports (during the first read) finds it, half loaded, in this thread.
        self._lock = threading.RLock()
        _BY_GROUP.setdefault(group, self)  # the first of a group is the process' (tests make others)

    def reserved(self, name: str) -> str | None:
        """Why ``name`` is not this registry's to give (see :data:`RESERVED`), or None."""
        check = RESERVED.get(self.group)
        return None if check is None else check(name)

    def _accepted(self, obj: Any) -> T:
        """``accept(obj)``, with its TypeError (not a declaration) as an InputError for a caller."""
        try:
            return self._accept(obj)
        except TypeError as exc:
            raise InputError(str(exc)) from None

    # --- adding ---------------------------------------------------------------------------------
    def add_builtin(self, obj: Any) -> T:
        found = self._accept(obj)
        with self._lock:
            self._builtin[self._name_of(found)] = found
        return found

    def register(self, obj: Any) -> T:
        """Add ``obj`` at run time (``hs.register``). Taking a built-in's or a plugin's name, a
        reserved name, or a role label that another declaration holds is refused; registering the
        same name again replaces the earlier run-time one (a notebook cell run twice)."""
        found = self._accepted(obj)
        name = self._name_of(found)
        why = self.reserved(name)
        if why is not None:
            raise InputError(f"{self.kind} {name!r}: {why}", hint="choose another name for yours")
        with self._lock:  # the checks and the addition at once: a second thread sees either none or both
            self._load()
            if name in self._builtin:
                raise InputError(
                    f"{self.kind} {name!r} is a built-in {self.kind}", hint="choose another name for yours"
                )
            if name in self._plugins:
                raise InputError(
                    f"{self.kind} {name!r} is already defined by the plugin {self._origin[name]}",
                    hint="choose another name for yours",
                )
            others = {k: v for k, v in self._all().items() if k != name}
            why = self._clash(found, others)
            if why is not None:
                raise InputError(f"{self.kind} {name!r}: {why}", hint="choose another")
            self._runtime[name] = found
        return found

    def unregister(self, name: str) -> None:
        """Remove a run-time registration (built-ins and plugins stay)."""
        with self._lock:
            if name not in self._runtime:
                raise InputError(f"{self.kind} {name!r} was not registered at run time")
            del self._runtime[name]

    def origin(self, name: str) -> str:
        """'built-in', 'plugin PACKAGE' or 'registered at run time'."""
        with self._lock:
            self._load()
            if name in self._builtin:
                return "built-in"
            if name in self._plugins:
                return f"plugin {self._origin[name]}"
            return "registered at run time"

    # --- plugins --------------------------------------------------------------------------------
    def _load(self) -> None:
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            self._load_builtins()
            self._load_plugins()

    def _load_builtins(self) -> None:
        """Import the module that registers the built-ins (nothing to do without one, or when
        it is imported already): never the plugins, which a plugin's own import may be reading."""
        if self._builtins_from is not None:
            import importlib

            importlib.import_module(self._builtins_from)

    def _load_plugins(self) -> None:
        from importlib.metadata import entry_points

        for point in entry_points(group=self.group):
            package = f"{point.dist.name} {point.dist.version}" if point.dist is not None else point.value
            where = f"plugin {package} ({self.group}: {point.name} = {point.value})"
            try:
                loaded = point.load()
            # A broken plugin is named and skipped, also one that calls sys.exit while importing;
            # KeyboardInterrupt (Ctrl-C) is the user's, and stops.
            except (Exception, SystemExit) as exc:  # noqa: BLE001
                first = str(exc).splitlines()[0] if str(exc) else ""
                _warn(f"{where} failed to import ({type(exc).__name__}: {first}); left out")
                continue
            for obj in loaded if isinstance(loaded, list | tuple) else [loaded]:
                try:
                    found = self._accept(obj)
                    name = self._name_of(found)
                except Exception as exc:  # noqa: BLE001 - not a declaration, or one that fails its checks
                    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    _warn(f"{where}: {first}; left out")
                    continue
                reserved = self.reserved(name)  # first, as register() asks it: it says why
                if reserved is not None:
                    _warn(f"{where}: {self.kind} {name!r}: {reserved}; left out")
                elif name in self._builtin:
                    _warn(f"{where}: {self.kind} {name!r} collides with a built-in {self.kind}; left out")
                elif name in self._plugins:
                    _warn(
                        f"{where}: {self.kind} {name!r} is already defined by {self._origin[name]}; left out"
                    )
                elif (why := self._clash(found, {**self._builtin, **self._plugins})) is not None:
                    _warn(f"{where}: {self.kind} {name!r}: {why}; left out")
                else:
                    self._plugins[name] = found
                    self._origin[name] = package

    # --- reading --------------------------------------------------------------------------------
    def _all(self) -> dict[str, T]:
        with self._lock:
            self._load()
            return {**self._builtin, **self._plugins, **self._runtime}

    def __setitem__(self, name: str, obj: Any) -> None:
        """Put ``obj`` under ``name`` for this process, over any other of that name (tests patch
        the registry this way; users call :meth:`register`, which refuses to shadow)."""
        self.put(name, self._accept(obj))

    def __delitem__(self, name: str) -> None:
        with self._lock:
            for layer in (self._runtime, self._plugins, self._builtin):
                if name in layer:
                    del layer[name]
                    return
        raise KeyError(name)

    def builtins(self) -> dict[str, T]:
        with self._lock:
            self._load_builtins()
            return dict(self._builtin)

    def put(self, name: str, found: T, check: Callable[[], None] | None = None) -> None:
        """Keep ``found``, a declaration headscope made and checked itself (``hs.detect``'s pattern),
        under ``name`` for this process, over an earlier run-time one of that name. What users hand
        in goes through :meth:`register`, which checks it. ``check`` runs under the registry's lock,
        just before: what it checks (a role label still free) cannot change until ``found`` is in."""
        with self._lock:
            self._load()
            if check is not None:
                check()
            self._runtime[name] = found

    def view(self, keep: Callable[[T], bool]) -> View[T]:
        """The declarations that ``keep`` admits, read live (one part of one table)."""
        return View(self, keep)


class View(_Live[T]):
    """Some of a registry's declarations (those ``keep`` admits), read live from it: one table
    with parts, where each reader sees the part it needs. Adding, removing and asking where a
    declaration comes from go to the registry itself, with its checks."""

    def __init__(self, registry: Registry[T], keep: Callable[[T], bool]) -> None:
        self.registry, self._keep = registry, keep
        self.kind, self.group = registry.kind, registry.group

    def _all(self) -> dict[str, T]:
        return {name: found for name, found in self.registry._all().items() if self._keep(found)}

    def __setitem__(self, name: str, obj: Any) -> None:
        self.registry[name] = obj

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        del self.registry[name]

    def register(self, obj: Any) -> T:
        return self.registry.register(obj)

    def unregister(self, name: str) -> None:
        if name not in self:
            raise InputError(f"{self.kind} {name!r} was not registered at run time")
        self.registry.unregister(name)

    def origin(self, name: str) -> str:
        return self.registry.origin(name)

    def reserved(self, name: str) -> str | None:
        return self.registry.reserved(name)

    def builtins(self) -> dict[str, T]:
        return {name: found for name, found in self.registry.builtins().items() if self._keep(found)}


_BY_GROUP: dict[str, Registry] = {}


def _warn(message: str) -> None:
    warnings.warn(f"headscope: {message}", PluginWarning, stacklevel=3)
