"""Controllers' constructor arguments: a ``--controller-arg`` value's parsing, and validation against the
controller's typed configuration, a pydantic model made from the constructor's type hints or declared by the class
as ``config_model`` (`config_model_of`, `check_kwargs`)."""

from __future__ import annotations

import collections.abc
import enum
import inspect
import json
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      ValidationError, create_model)
from pydantic_core import PydanticCustomError

__all__ = ["ControllerConfig", "check_kwargs", "config_model_of", "parse_arg_value"]


class Described(Protocol):
    """What `check_kwargs` reads of a resolved controller (`commitenv.registry.Resolved`)."""

    name: str
    target: Callable[..., Any]


def describe(obj: Any) -> str:
    """A class or callable as an error message names it (its qualified name)."""
    return getattr(obj, "__qualname__", None) or type(obj).__name__


def parse_arg_value(text: str) -> Any:
    """A ``--controller-arg`` value: JSON when it parses as JSON, else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def check_kwargs(resolved: Described, kwargs: dict[str, Any], raw: dict[str, str] | None = None) -> dict[str, Any]:
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
            raise ValueError(f"controller {describe(target)}: config_model must be a pydantic BaseModel subclass, "
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
