"""Controllers registered by name, so the CLI, evaluation and leaderboard can build them from a string."""

from __future__ import annotations

from typing import Callable

from controllers.base import Controller

_REGISTRY: dict[str, Callable[..., Controller]] = {}


def register(name: str) -> Callable[[type[Controller]], type[Controller]]:
    """Class decorator: make the controller constructible as ``make(name)``."""

    def deco(cls: type[Controller]) -> type[Controller]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"controller name '{name}' is already registered to {_REGISTRY[name].__name__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def register_factory(name: str, factory: Callable[..., Controller]) -> None:
    """Register a configured variant (e.g. an ablation flag of another controller) under ``name``."""
    if name in _REGISTRY:
        raise ValueError(f"controller name '{name}' is already registered")

    def build(**kwargs) -> Controller:
        ctrl = factory(**kwargs)
        ctrl.name = name
        return ctrl

    _REGISTRY[name] = build


def available() -> list[str]:
    """Registered controller names."""
    return sorted(_REGISTRY)


def make(name: str, **kwargs) -> Controller:
    """Instantiate a registered controller; unknown names list the available ones."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown controller '{name}'; available: {', '.join(available())}") from None
    return factory(**kwargs)
