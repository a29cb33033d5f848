"""Every public module-level function of ``vision_tx`` has a docstring that names each of its parameters in double
backquotes (``name``), so the short prose of the house style still tells what each argument is."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import vision_tx

SKIPPED = {"self", "cls"}


def public_functions() -> list[tuple[str, object]]:
    """``(qualified name, function)`` for every public function defined at the top of a ``vision_tx`` module."""
    modules = [vision_tx]
    for info in pkgutil.walk_packages(vision_tx.__path__, prefix="vision_tx."):
        modules.append(importlib.import_module(info.name))
    found = []
    for module in modules:
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or not inspect.isfunction(obj) or obj.__module__ != module.__name__:
                continue
            found.append((f"{module.__name__}.{name}", obj))
    return found


def checked_parameters(function: object) -> list[str]:
    """The parameter names of ``function`` a docstring must name: all but ``self``, ``cls``, ``*args``, ``**kwargs``."""
    names = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name in SKIPPED:
            continue
        if parameter.kind is parameter.VAR_POSITIONAL and parameter.name == "args":
            continue
        if parameter.kind is parameter.VAR_KEYWORD and parameter.name == "kwargs":
            continue
        names.append(parameter.name)
    return names


def undocumented(function: object) -> list[str]:
    """The parameter names of ``function`` that its docstring does not write as ``name`` (or with its shape inside the
    backquotes, ``name [N,4]``, or called, ``name(x)``)."""
    doc = inspect.getdoc(function) or ""
    return [name for name in checked_parameters(function) if not re.search(rf"``{re.escape(name)}(``|\s|\[|=|\()", doc)]


def test_public_functions_found() -> None:
    """The walk reaches the whole package, not just its top."""
    names = {name for name, _ in public_functions()}
    assert len(names) > 200
    assert any(name.startswith("vision_tx.ops.") for name in names)


def test_public_function_docstrings_name_every_parameter() -> None:
    """The failure lists every function and the parameter names its docstring lacks."""
    failures = []
    for name, function in public_functions():
        if not checked_parameters(function):
            continue
        if not inspect.getdoc(function):
            failures.append(f"{name}: no docstring")
            continue
        missing = undocumented(function)
        if missing:
            failures.append(f"{name}: {', '.join(missing)}")
    assert not failures, f"{len(failures)} public functions do not name every parameter:\n" + "\n".join(failures)
