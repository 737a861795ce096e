"""Controllers registered by name, so the CLI, evaluation and leaderboard can build them from a string. It lives in
the library and never imports the plug-ins: the built-ins (package ``commitenv_controllers``, folder ``controllers/``) are found like any third-party
controller, through their entry points, and register themselves when imported.

A controller is given by a *spec*, one of

``NAME``                   a registered name (``@register``), else an entry point of the group
                           ``commitenv.controllers`` (``NAME = "module:Class"`` in a distribution's metadata);
``module:Class``           a class importable from ``module`` (``mypkg.ctl:MyController``);
``path/to/file.py:Class``  a class defined in a Python file (loaded once per process under a private name);
``sb3:DIR``                a policy trained by ``commitenv train`` (folder DIR, or the name of a shipped baseline),
                           or any stable-baselines3 model (``sb3:DIR`` holding model.zip, or ``sb3:PATH.zip``),
                           run by ``commitenv_controllers.sb3_policy.SB3Policy`` (imported only then).

`resolve` turns a spec into a `Resolved` (the name a run is recorded under, its origin, the constructor);
`make` builds an instance. The origin (``builtin``, ``entry_point:<dist>``, ``module:<mod>:<Class>``,
``path:<abs path>:<Class>``, ``sb3:<abs dir>``) is what `spec_from_origin` turns back into a spec, so a recorded run
can be rebuilt (``commitenv attribute``).

Constructor arguments (``--controller-arg KEY=VALUE``) are validated by `check_kwargs` against the controller's
typed configuration, a pydantic model: made from the constructor's type hints, or declared by the class as
``config_model`` (a pydantic ``BaseModel`` subclass, see `config_model_of`); both live in
`commitenv.controller_config` and are re-exported here.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from commitenv.control import Controller
from commitenv.controller_config import ControllerConfig, check_kwargs, config_model_of, describe, parse_arg_value

ENTRY_POINT_GROUP = "commitenv.controllers"
SB3_PREFIX = "sb3:"  # sb3:DIR, a trained policy (commitenv train)
_SB3_MODULE = "commitenv_controllers.sb3_policy"

__all__ = ["ENTRY_POINT_GROUP", "ControllerConfig", "Listing", "Resolved", "all_names", "available", "check_kwargs",
           "config_model_of", "controller_name", "default_name", "describe_as", "discover", "first_doc_line", "make",
           "origin_of", "parse_arg_value", "register", "register_factory", "resolve", "spec_from_origin"]

_REGISTRY: dict[str, Callable[..., Controller]] = {}
_TARGETS: dict[str, Callable[..., Any]] = {}  # what describes a registered name: its class (signature, doc)
_EP_ORIGINS: dict[str, str] = {}  # names first loaded from an entry point -> "entry_point:<dist>"
_FILE_MODULES: dict[str, str] = {}  # private module name -> absolute path of a controller file


def register(name: str) -> Callable[[type[Controller]], type[Controller]]:
    """Class decorator: make the controller constructible as ``make(name)``."""

    def deco(cls: type[Controller]) -> type[Controller]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"controller name '{name}' is already registered to {_REGISTRY[name].__name__}")
        cls.name = name
        _REGISTRY[name] = cls
        _TARGETS[name] = cls
        return cls

    return deco


def register_factory(name: str, factory: Callable[..., Controller], *, like: Callable[..., Any] | None = None) -> None:
    """Register a configured variant (e.g. an ablation flag of another controller) under ``name``; ``like``
    (optional) is a class with the factory's signature and docstring, for argument checks and listings."""
    if name in _REGISTRY:
        raise ValueError(f"controller name '{name}' is already registered")

    def build(**kwargs) -> Controller:
        ctrl = factory(**kwargs)
        ctrl.name = name
        return ctrl

    _REGISTRY[name] = build
    _TARGETS[name] = like if like is not None else factory


def describe_as(name: str, like: Callable[..., Any]) -> None:
    """Give the registered ``name`` the signature and docstring of ``like`` (a factory registered without one)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown controller '{name}'")
    _TARGETS[name] = like


def available() -> list[str]:
    """Registered controller names."""
    return sorted(_REGISTRY)


# ================================================================================================ resolving
@dataclass(frozen=True)
class Resolved:
    """A controller spec, resolved: ``name`` (recorded with the run), ``origin`` (how to find it again),
    ``factory`` (called with the constructor's keyword arguments), ``target`` (the class or callable whose
    signature and docstring describe it)."""

    spec: str
    name: str
    origin: str
    factory: Callable[..., Controller]
    target: Callable[..., Any]

    @property
    def doc(self) -> str:
        return first_doc_line(self.target)

    def make(self, **kwargs) -> Controller:
        ctrl = self.factory(**kwargs)
        if not isinstance(ctrl, Controller):
            raise ValueError(f"controller '{self.spec}': {describe(self.factory)} returned "
                             f"{type(ctrl).__name__}, not a Controller")
        ctrl.name = self.name
        return ctrl


def make(name: str, **kwargs) -> Controller:
    """Instantiate a controller from a spec (a registered or entry-point name, ``module:Class`` or
    ``path/to/file.py:Class``); unknown names list the available ones."""
    return resolve(name).make(**kwargs)


def resolve(spec: str) -> Resolved:
    """The controller ``spec`` names; ValueError with the reason when it cannot be found or is not a
    `Controller` (missing file, module not importable, class not found, not a subclass)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"controller: expected a name, module:Class or path/to/file.py:Class, got {spec!r}")
    spec = spec.strip()
    if spec.startswith(SB3_PREFIX):
        return _resolve_sb3(spec)
    if ":" not in spec:
        return _resolve_name(spec)
    where, _, cls_name = spec.rpartition(":")
    if not where or not cls_name:
        raise ValueError(f"controller '{spec}': expected module:Class or path/to/file.py:Class")
    if _looks_like_path(where):
        module, path = _load_file(where, spec)
        obj = _get_class(module, cls_name, spec, f"file {path}")
        origin = f"path:{path}:{cls_name}"
    else:
        try:
            module = _import_module(where)
        except Exception as e:  # ImportError, or whatever the module raised while importing
            raise ValueError(f"controller '{spec}': module '{where}' cannot be imported "
                             f"({type(e).__name__}: {e})") from None
        obj = _get_class(module, cls_name, spec, f"module '{where}'")
        origin = f"module:{where}:{cls_name}"
    _check_controller_class(obj, spec)
    return Resolved(spec, default_name(obj), origin, obj, obj)


def _import_module(where: str) -> Any:
    """``importlib.import_module``; when the top-level package is not installed but sits in the working directory
    (a project's own package, run from its folder), imported from there, as ``python -m`` would."""
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as e:
        top = where.split(".")[0]
        cwd = os.getcwd()
        local = os.path.isdir(os.path.join(cwd, top)) or os.path.isfile(os.path.join(cwd, top + ".py"))
        if e.name != top or not local or cwd in sys.path:
            raise
    sys.path.insert(0, cwd)
    try:
        return importlib.import_module(where)
    finally:
        sys.path.remove(cwd)


def spec_from_origin(origin: str | None, name: str) -> str:
    """The spec that rebuilds a controller recorded as ``name`` with ``origin`` (see `resolve`)."""
    if not origin or origin == "builtin" or origin.startswith("entry_point:"):
        return name
    kind, _, rest = origin.partition(":")
    if kind in ("module", "path") and ":" in rest:
        return rest
    if kind == SB3_PREFIX[:-1] and rest:
        return origin  # sb3:<abs dir> is its own spec
    raise ValueError(f"controller origin '{origin}': expected builtin, entry_point:<dist>, module:<mod>:<Class>, "
                     "path:<file>:<Class> or sb3:<dir>")


def origin_of(ctrl: Controller | type) -> str | None:
    """Where a controller instance's (or class's) code can be found again, or None (a class defined in
    ``__main__``, inside a function, or an instance of a registered factory that is not its class)."""
    own = None if isinstance(ctrl, type) else getattr(ctrl, "spec_origin", None)
    if isinstance(own, str) and own:  # an instance that knows its own origin (a trained policy: sb3:<dir>)
        return own
    cls = ctrl if isinstance(ctrl, type) else type(ctrl)
    reg = _registered_name(cls)
    if reg is not None:
        return _registry_origin(reg)
    mod, qual = cls.__module__, cls.__qualname__
    if "<locals>" in qual or mod == "__main__":
        return None
    if mod in _FILE_MODULES:
        return f"path:{_FILE_MODULES[mod]}:{qual}"
    return f"module:{mod}:{qual}"


def default_name(cls: type) -> str:
    """The name a controller class runs under: its registered name; else a ``name`` its own body sets
    (not one inherited, e.g. from a registered parent, nor the base class's placeholder ``"base"``); else the
    class name."""
    reg = _registered_name(cls)
    if reg is not None:
        return reg
    own = vars(cls).get("name")
    return own if isinstance(own, str) and own and own != Controller.name else cls.__name__


def controller_name(ctrl: Controller) -> str:
    """The name an instance is recorded under: one set on the instance (`make` does), else its class's
    `default_name`."""
    own = vars(ctrl).get("name") if hasattr(ctrl, "__dict__") else None
    return own if isinstance(own, str) and own else default_name(type(ctrl))


def _resolve_name(name: str) -> Resolved:
    if name in _REGISTRY:
        return Resolved(name, name, _registry_origin(name), _REGISTRY[name], _TARGETS.get(name, _REGISTRY[name]))
    eps = [ep for ep in _entry_points() if ep.name == name]
    if not eps:
        raise ValueError(f"unknown controller '{name}'; available: {', '.join(all_names())} "
                         "(or give module:Class or path/to/file.py:Class)")
    ep = eps[0]
    obj = _load_entry_point(ep)
    if name in _REGISTRY:  # importing the entry point registered it (a package that registers its controllers)
        return Resolved(name, name, _registry_origin(name), _REGISTRY[name], _TARGETS.get(name, _REGISTRY[name]))
    origin = f"entry_point:{_dist_name(ep)}"
    _EP_ORIGINS[name] = origin
    return Resolved(name, name, origin, obj, obj)


def _resolve_sb3(spec: str) -> Resolved:
    """``sb3:DIR``: the trained-policy controller (`commitenv_controllers.sb3_policy`, imported now, not before) bound
    to the folder DIR (or a shipped baseline of that name); its origin ``sb3:<abs dir>`` rebuilds it."""
    where = spec[len(SB3_PREFIX):].strip()
    if not where:
        raise ValueError(f"controller '{spec}': expected sb3:DIR or sb3:PATH.zip (a `commitenv train` folder or a "
                         "stable-baselines3 model)")
    try:
        module = importlib.import_module(_SB3_MODULE)
    except Exception as e:  # ImportError, or whatever the module raised
        raise ValueError(f"controller '{spec}': the trained-policy controller ({_SB3_MODULE}) cannot be imported "
                         f"({type(e).__name__}: {e})") from None
    path = module.policy_dir(where, spec)  # ValueError naming the folder and what is missing
    cls = module.SB3Policy
    return Resolved(spec, module.policy_name(path), f"{SB3_PREFIX}{path}", functools.partial(cls, str(path)), cls)


def _registry_origin(name: str) -> str:
    if name in _EP_ORIGINS:
        return _EP_ORIGINS[name]
    target = _TARGETS.get(name, _REGISTRY[name])
    mod = getattr(target, "__module__", "") or ""
    if mod == "commitenv_controllers" or mod.startswith("commitenv_controllers."):
        return "builtin"
    qual = getattr(target, "__qualname__", "")
    if isinstance(target, type) and "<locals>" not in qual and mod != "__main__":
        if mod in _FILE_MODULES:
            return f"path:{_FILE_MODULES[mod]}:{qual}"
        return f"module:{mod}:{qual}"
    return "builtin"  # registered in this process by code that cannot be located again


def _registered_name(cls: Any) -> str | None:
    for n, t in _TARGETS.items():
        if t is cls and (_REGISTRY[n] is cls or getattr(cls, "name", None) == n):
            return n
    n = getattr(cls, "name", None)
    if isinstance(n, str) and _REGISTRY.get(n) is cls:
        return n
    return None


def _looks_like_path(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where or where.startswith(".")


def _load_file(where: str, spec: str) -> tuple[types.ModuleType, Path]:
    path = Path(where).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"controller '{spec}': file {where} not found"
                         + ("" if not path.exists() else " (it is a folder)"))
    mod_name = "commitenv_controller_file_" + hashlib.sha1(str(path).encode()).hexdigest()[:16]
    module = sys.modules.get(mod_name)
    if module is not None:
        return module, path
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ValueError(f"controller '{spec}': {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    _FILE_MODULES[mod_name] = str(path)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[mod_name]
        _FILE_MODULES.pop(mod_name, None)
        raise ValueError(f"controller '{spec}': {path} cannot be imported ({type(e).__name__}: {e})") from None
    return module, path


def _get_class(module: types.ModuleType, cls_name: str, spec: str, where: str) -> Any:
    obj: Any = module
    for part in cls_name.split("."):
        if not hasattr(obj, part):
            found = sorted(k for k, v in vars(module).items()
                           if isinstance(v, type) and issubclass(v, Controller) and v is not Controller
                           and getattr(v, "__module__", None) == module.__name__)
            hint = (f"; controllers defined there: {', '.join(found)}" if found
                    else "; it defines no Controller subclass")
            raise ValueError(f"controller '{spec}': {where} has no class '{cls_name}'{hint}")
        obj = getattr(obj, part)
    return obj


def _check_controller_class(obj: Any, spec: str) -> None:
    if not isinstance(obj, type):
        raise ValueError(f"controller '{spec}': {describe(obj)} is not a class (expected a subclass of "
                         "commitenv_controllers.Controller)")
    if not issubclass(obj, Controller):
        raise ValueError(f"controller '{spec}': class {obj.__name__} is not a Controller subclass "
                         "(derive it from commitenv.control.Controller)")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise ValueError(f"controller '{spec}': class {obj.__name__} does not implement {missing}")


# ================================================================================================ entry points
def _entry_points() -> list[Any]:
    """The ``commitenv.controllers`` entry points of the installed distributions (first of a name wins)."""
    try:
        eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # a broken installation must not make built-in names unusable
        return []
    seen: dict[str, Any] = {}
    for ep in eps:
        seen.setdefault(ep.name, ep)
    return list(seen.values())


def _dist_name(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) if dist is not None else None
    if name is None and dist is not None:
        name = getattr(dist, "metadata", {}).get("Name") if hasattr(dist, "metadata") else None
    return str(name) if name else "unknown"


def _load_entry_point(ep: Any) -> Callable[..., Any]:
    spec = f"{ep.name} (entry point {ep.value!s} of {_dist_name(ep)})"
    try:
        obj = ep.load()
    except Exception as e:
        raise ValueError(f"controller {spec} cannot be loaded ({type(e).__name__}: {e})") from None
    if isinstance(obj, type):
        _check_controller_class(obj, spec)
    elif not callable(obj):
        raise ValueError(f"controller {spec}: {describe(obj)} is neither a Controller subclass nor a factory")
    return obj


def all_names() -> list[str]:
    """Registered names and the names of installed entry points, sorted."""
    return sorted(set(_REGISTRY) | {ep.name for ep in _entry_points()})


@dataclass(frozen=True)
class Listing:
    name: str
    origin: str
    doc: str


def discover() -> list[Listing]:
    """Every registered and entry-point controller: name, origin, first docstring line (an entry point that
    cannot be loaded is listed with the reason)."""
    out = {n: Listing(n, _registry_origin(n), first_doc_line(_TARGETS.get(n, _REGISTRY[n]))) for n in _REGISTRY}
    for ep in _entry_points():
        if ep.name in out:
            continue
        origin = f"entry_point:{_dist_name(ep)}"
        try:
            doc = first_doc_line(_load_entry_point(ep))
        except ValueError as e:
            doc = f"(cannot load: {e})"
        out[ep.name] = Listing(ep.name, origin, doc)
    return [out[n] for n in sorted(out)]


def first_doc_line(obj: Any) -> str:
    doc = inspect.getdoc(obj) if obj is not None else None
    if not doc or (isinstance(obj, type) and obj.__doc__ is None):
        return ""
    return doc.strip().splitlines()[0].strip()
