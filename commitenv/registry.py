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
``config_model`` (a pydantic ``BaseModel`` subclass, see `config_model_of`).
"""

from __future__ import annotations

import collections.abc
import enum
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      ValidationError, create_model)
from pydantic_core import PydanticCustomError

from commitenv.control import Controller

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
            raise ValueError(f"controller '{self.spec}': {_describe(self.factory)} returned "
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
        raise ValueError(f"controller '{spec}': {_describe(obj)} is not a class (expected a subclass of "
                         "commitenv_controllers.Controller)")
    if not issubclass(obj, Controller):
        raise ValueError(f"controller '{spec}': class {obj.__name__} is not a Controller subclass "
                         "(derive it from commitenv.control.Controller)")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise ValueError(f"controller '{spec}': class {obj.__name__} does not implement {missing}")


def _describe(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__


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
        raise ValueError(f"controller {spec}: {_describe(obj)} is neither a Controller subclass nor a factory")
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


# ================================================================================================ arguments
def parse_arg_value(text: str) -> Any:
    """A ``--controller-arg`` value: JSON when it parses as JSON, else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def check_kwargs(resolved: Resolved, kwargs: dict[str, Any], raw: dict[str, str] | None = None) -> dict[str, Any]:
    """Validate constructor arguments against the controller's typed configuration (see `config_model_of`) and
    return them as validated, keyed and ordered as given: scalars of the declared types (an int given for a
    ``float`` parameter becomes a float), containers as JSON holds them (see `_as_recorded`); keys a
    ``**kwargs`` parameter (or a ``config_model`` with ``extra="allow"``) accepts pass unchecked. ``raw`` (the
    text of each value as typed, from ``--controller-arg``): a value that parsed as JSON but fits only as text
    (``label=123`` for a ``str`` parameter) becomes that text. Unknown keys (listing the accepted ones), values
    that do not fit and missing required arguments are one ValueError naming every problem, e.g.
    ``controller 'epact': argument 'workers' expects int or None, got abc (str)``."""
    config = config_model_of(resolved.target)
    if config is None:  # no signature to check against (a builtin, say)
        return dict(kwargs)
    raw = raw or {}
    unknown = [k for k in kwargs if k not in config.fields]
    problems = []
    if unknown and not config.extra:
        plural = "s" if len(unknown) > 1 else ""
        problems.append(f"unknown argument{plural} {', '.join(repr(k) for k in unknown)} "
                        f"(accepted: {', '.join(config.fields) or 'none'})")
    given = {k: v for k, v in kwargs.items() if k in config.fields}
    validated, errors = _validate(config.model, given)
    retry = [k for k, errs in errors.items() if k in given and k in raw and not isinstance(given[k], (str, dict, list))
             and all(_is_type_error(e) for e in errs)]
    if retry:  # e.g. label=123 for a str parameter: the text as typed
        validated, errors = _validate(config.model, {**given, **{k: raw[k] for k in retry}})
    order = {k: i for i, k in enumerate(kwargs)}
    for key, errs in sorted(errors.items(), key=lambda kv: order.get(kv[0], len(order))):
        if key not in config.fields:  # an error of the whole configuration (a config_model's model validator)
            problems += [_where(e) + e["msg"] for e in errs]
            continue
        want = _type_name(config.model.model_fields[config.fields[key]].annotation)
        if key not in given:
            problems.append(f"missing argument '{key}' ({want})")
            continue
        shown = raw[key] if key in raw else repr(given[key])
        kind = "None" if given[key] is None else type(given[key]).__name__
        at = sorted({_item(e) for e in errs if _is_type_error(e) and _item(e)})
        misfits = [f"item {at[0]} does not fit" if len(at) == 1 else f"items {', '.join(at)} do not fit"] if at else []
        detail = ", ".join(misfits + [_where(e) + e["msg"] for e in errs if not _is_type_error(e)])
        problems.append(f"argument '{key}' expects {want}, got {shown} ({kind})" + (f": {detail}" if detail else ""))
    if problems:
        raise ValueError(f"controller '{resolved.name}': {'; '.join(problems)}")
    assert validated is not None
    return {k: _as_recorded(getattr(validated, config.fields[k]), v) if k in config.fields else v
            for k, v in kwargs.items()}


def _as_recorded(value: Any, given: Any) -> Any:
    """A validated value as a run records it (plain JSON: a tuple as a list), so that the controller gets what
    ``commitenv attribute`` and a resumed ``--seeds`` run later give it; one JSON cannot hold (an Enum member, a
    Path) stays as given, for the constructor to convert."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return given


@dataclass(frozen=True)
class ControllerConfig:
    """A controller's typed configuration: ``model`` (a pydantic model of its keyword arguments), ``fields``
    (argument name -> the model's attribute), ``extra`` (whether keys beyond ``fields`` are accepted)."""

    model: type[BaseModel]
    fields: dict[str, str]
    extra: bool


_CONFIGS: dict[Any, ControllerConfig | None] = {}


def config_model_of(target: Callable[..., Any]) -> ControllerConfig | None:
    """The typed configuration `check_kwargs` validates against (built once per target), or None when the target
    has no signature. A plug-in declares it in one of two ways:

    * type hints on its constructor's parameters (``def __init__(self, workers: int | None = None, mode:
      Literal["a", "b"] = "a", nominal: list[float] | None = None)``): a pydantic model is made from them, strict
      for scalars (a bool is no int, 2.5 or 2.0 no int, "abc" no float; an int is accepted for a float, as a
      float), lax for containers (a list for a tuple); an unannotated or ``Any`` parameter takes anything, a
      ``**kwargs`` parameter takes keys beyond the named ones unchecked;
    * a class attribute ``config_model``, a pydantic ``BaseModel`` subclass whose fields (by alias when given) are
      the constructor's keyword arguments, used as written (its strictness, constraints and validators); keys
      beyond its fields are refused unless it sets ``extra="allow"``. The constructor is called with the
      validated field values as keyword arguments."""
    try:
        return _CONFIGS[target]
    except KeyError:
        pass
    except TypeError:  # unhashable target: build every time
        return _build_config(target)
    config = _CONFIGS[target] = _build_config(target)
    return config


def _build_config(target: Callable[..., Any]) -> ControllerConfig | None:
    """The target's ``config_model``, else a model of its signature (see `config_model_of`)."""
    declared = getattr(target, "config_model", None)
    if declared is not None:
        if not (isinstance(declared, type) and issubclass(declared, BaseModel)):
            raise ValueError(f"controller {_describe(target)}: config_model must be a pydantic BaseModel subclass, "
                             f"not {declared!r}")
        fields = {f.alias or n: n for n, f in declared.model_fields.items()}
        return ControllerConfig(declared, fields, declared.model_config.get("extra") == "allow")
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    params = {n: p for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    hints = _annotations(target, params)
    # attributes f0, f1, ... aliased to the parameter names: any name (``_x``, ``json``, ``model_x``) is a valid
    # argument; defaults come from factories so that pydantic never copies them
    spec: dict[str, Any] = {}
    for i, (n, p) in enumerate(params.items()):
        default = {} if p.default is p.empty else {"default_factory": lambda d=p.default: d}
        spec[f"f{i}"] = (_strict(hints[n]), Field(alias=n, **default))
    name = "".join(c if c.isalnum() else "_" for c in getattr(target, "__name__", "Controller")) + "Config"
    try:
        model = _model(name, spec)
    except Exception:  # an annotation pydantic has no schema for: that parameter takes anything
        for attr, (ann, info) in spec.items():
            try:
                _model(name, {attr: (ann, info)})
            except Exception:
                spec[attr] = (Any, info)
        model = _model(name, spec)
    return ControllerConfig(model, {n: f"f{i}" for i, n in enumerate(params)},
                            any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()))


def _model(name: str, spec: dict[str, Any]) -> type[BaseModel]:
    """A pydantic model of constructor parameters (any annotated class allowed, checked by isinstance)."""
    return create_model(name, __config__=ConfigDict(arbitrary_types_allowed=True), **spec)


def _annotations(target: Any, params: dict[str, inspect.Parameter]) -> dict[str, Any]:
    """Each parameter's annotation, evaluated (string annotations, as ``from __future__ import annotations``
    leaves them, in the modules of the target and its base classes); one that cannot be evaluated is Any."""
    fn = target.__init__ if isinstance(target, type) else target
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # one unresolvable name fails them all: evaluate each below
        hints = {}
    spaces = [getattr(fn, "__globals__", {})]
    spaces += [vars(sys.modules[c.__module__]) for c in getattr(target, "__mro__", ()) if c.__module__ in sys.modules]
    out = {}
    for n, p in params.items():
        ann = hints.get(n, p.annotation)
        if isinstance(ann, str):
            ann = next((v for v in (_evaluate(ann, ns) for ns in spaces) if v is not _UNRESOLVED), Any)
        out[n] = Any if ann is p.empty else ann
    return out


_UNRESOLVED = object()


def _evaluate(text: str, namespace: dict[str, Any]) -> Any:
    """A string annotation evaluated in ``namespace``, or `_UNRESOLVED`."""
    try:
        return eval(text, dict(namespace))  # noqa: S307  (an annotation of code already imported)
    except Exception:
        return _UNRESOLVED


def _strict(ann: Any) -> Any:
    """``ann`` with its scalars strict (`check_kwargs`): StrictInt/StrictFloat/StrictBool/StrictStr inside
    unions, Annotated and containers, and Literal choices matched with their type (True is not 1)."""
    simple = {bool: StrictBool, int: StrictInt, float: StrictFloat, str: StrictStr}
    if isinstance(ann, type) and ann in simple:
        return simple[ann]
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return typing.Annotated[(_strict(args[0]), *ann.__metadata__)]
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_strict(a) for a in args)]
    if origin is typing.Literal:
        return typing.Annotated[ann, BeforeValidator(_literal_of_type(args))]
    if origin is not None and args:
        try:
            return origin[tuple(a if a is Ellipsis else _strict(a) for a in args)]
        except TypeError:
            return ann
    return ann


def _literal_of_type(choices: tuple[Any, ...]) -> Callable[[Any], Any]:
    """A check that refuses a number or bool equal to a choice of another type (1.0 or True for ``Literal[1]``)."""

    def check(value: Any) -> Any:
        if isinstance(value, (bool, int, float)) and not any(type(c) is type(value) and c == value for c in choices):
            raise PydanticCustomError("literal_error", "Input should be {expected}",
                                      {"expected": ", ".join(repr(c) for c in choices)})
        return value

    return check


def _validate(model: type[BaseModel], data: dict[str, Any]) -> tuple[BaseModel | None, dict[str | None, list]]:
    """The validated model, or its errors by argument (None: errors of the whole model)."""
    try:
        return model.model_validate(data), {}
    except ValidationError as e:
        errors: dict[str | None, list] = {}
        for err in e.errors():
            errors.setdefault(str(err["loc"][0]) if err["loc"] else None, []).append(err)
        return None, errors


_TYPE_ERRORS = {"literal_error", "none_required", "is_instance_of", "is_subclass_of", "enum", "int_from_float",
                "int_parsing", "float_parsing", "bool_parsing", "union_tag_invalid"}


def _is_type_error(err: Any) -> bool:
    """Whether a pydantic error says the value is of the wrong type (rather than, say, out of range)."""
    return err["type"].endswith("_type") or err["type"] in _TYPE_ERRORS


def _item(err: Any) -> str:
    """Where in a list (or nested lists) a pydantic error is: ``1``, ``0/2``, or ""."""
    return "/".join(str(x) for x in err["loc"][1:] if isinstance(x, int))


def _where(err: Any) -> str:
    return f"item {_item(err)}: " if _item(err) else ""


def _type_name(ann: Any) -> str:
    """An annotation in words: ``int or None``, ``float or 'measured'``, ``one of 'a', 'b'``, ``list of float``."""
    if ann is Any:
        return "any value"
    if ann is None or ann is type(None):
        return "None"
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return repr(args[0]) if len(args) == 1 else "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args]
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in ann)
    if origin is tuple and args and args[-1] is not Ellipsis:
        return "[" + ", ".join(_type_name(a) for a in args) + "]"
    if origin is dict and len(args) == 2:
        return f"dict of {_inner(args[0])} to {_inner(args[1])}"
    if origin is not None and args:
        kind = "list" if origin in (list, tuple, collections.abc.Sequence) else getattr(origin, "__name__", "list")
        return f"{kind} of {_inner(args[0])}"
    return getattr(ann, "__name__", None) or str(ann)


def _inner(ann: Any) -> str:
    """`_type_name` of a container's item, parenthesised when it is a choice: ``list of (float or None)``."""
    name = _type_name(ann)
    return f"({name})" if " or " in name or name.startswith("one of") else name
