"""Lazy public names of a package: each loaded from its submodule on first use, so that importing the package (as
``import commitenv`` does to register scenarios and sites) pulls in nothing heavy."""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable


def lazy_names(package: str, where: dict[str, str], namespace: dict[str, Any]) -> tuple[Callable, Callable]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` whose public name N lives in submodule ``where[N]``;
    a name once loaded is kept in ``namespace`` (the package's globals)."""

    def __getattr__(name: str):
        mod = where.get(name)
        if mod is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{mod}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
