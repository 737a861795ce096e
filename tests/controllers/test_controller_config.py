"""Controller arguments are validated against the controller's typed configuration (issue 9): a pydantic model
made from the constructor's type hints, or the class's own ``config_model``; errors name the controller, every
bad argument, the expected type and the value given, in one message."""

from __future__ import annotations

import enum
import threading
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from commitenv.cli import main
from commitenv.control import Controller
from commitenv.registry import Resolved, check_kwargs, config_model_of, resolve
from helpers.scenarios import HOUR_SCENARIO


class _Acts(Controller):
    def act(self, observation, info):
        return {"active": 1, "clock": 1}


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Typed(_Acts):
    """Every kind of annotation a plug-in's constructor may use."""

    def __init__(self, n: int = 1, x: float = 0.5, flag: bool = False, label: str = "a",
                 mode: Literal["captured", "captured+forecast"] = "captured", level: Literal[0, 1] = 0,
                 fracs: list[float] | None = None, delay: float | str = 0.0, band: float | Literal["measured"] = 0.1,
                 workers: int | None = None, sizes: tuple[float, ...] = (1.0,), anything=None, json: int = 0,
                 color: Color = Color.RED, folder: Path | None = None) -> None:
        self.args = dict(n=n, x=x, flag=flag, label=label, mode=mode, level=level, fracs=fracs, delay=delay,
                         band=band, workers=workers, sizes=sizes, anything=anything, json=json, color=color,
                         folder=folder)


class Needs(_Acts):
    def __init__(self, target: float, lock: Any = threading.Lock()) -> None:  # noqa: B008  (not copyable)
        self.target = target


class Extra(_Acts):
    def __init__(self, level: int = 0, **rest: Any) -> None:
        self.level, self.rest = level, rest


class NoInit(_Acts):
    pass


class Unresolved(_Acts):
    def __init__(self, spec: NotDefinedAnywhere = None, n: int = 0) -> None:  # noqa: F821
        self.spec, self.n = spec, n


class HorizonConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    horizon_s: float = Field(600.0, gt=0)
    mode: Literal["a", "b"] = "a"


class Declared(_Acts):
    """Declares its configuration as a pydantic model."""

    config_model = HorizonConfig

    def __init__(self, **kwargs: Any) -> None:
        self.cfg = HorizonConfig(**kwargs)


def _res(cls: type) -> Resolved:
    return Resolved(cls.__name__, cls.__name__, "test", cls, cls)


def _error(cls: type, kwargs: dict[str, Any], raw: dict[str, str] | None = None) -> str:
    with pytest.raises(ValueError) as e:
        check_kwargs(_res(cls), kwargs, raw)
    return str(e.value)


# ------------------------------------------------------------------------------------------ from type hints
def test_valid_arguments_come_back_of_the_declared_types():
    given = dict(n=2, x=1, flag=True, label="b", mode="captured+forecast", level=1, fracs=[1, 0.5],
                 delay="measured", band="measured", workers=None, sizes=(2, 3), anything={"any": ["thing"]}, json=3)
    out = check_kwargs(_res(Typed), given)
    assert out == {**given, "x": 1.0, "fracs": [1.0, 0.5], "sizes": [2.0, 3.0]}
    assert list(out) == list(given)
    assert type(out["x"]) is float and [type(f) for f in out["fracs"]] == [float, float]
    # containers come back as a run records them (a tuple as a list), scalars in them of the declared type
    assert [type(f) for f in out["sizes"]] == [float, float]
    # a value JSON cannot hold once converted (an Enum member, a Path) is checked and returned as given
    assert check_kwargs(_res(Typed), {"color": "blue", "folder": "a/b"}) == {"color": "blue", "folder": "a/b"}
    assert check_kwargs(_res(Typed), {"delay": 5})["delay"] == 5.0  # float | str: the number, as a float
    assert Typed(**out).args["x"] == 1.0
    assert check_kwargs(_res(Typed), {}) == {}


@pytest.mark.parametrize("key, value, expected", [
    ("n", True, "argument 'n' expects int, got True (bool)"),
    ("n", 2.5, "argument 'n' expects int, got 2.5 (float)"),
    ("n", 2.0, "argument 'n' expects int, got 2.0 (float)"),
    ("n", "3", "argument 'n' expects int, got '3' (str)"),
    ("x", "abc", "argument 'x' expects float, got 'abc' (str)"),
    ("x", False, "argument 'x' expects float, got False (bool)"),
    ("flag", 1, "argument 'flag' expects bool, got 1 (int)"),
    ("label", 3, "argument 'label' expects str, got 3 (int)"),
    ("mode", "both", "argument 'mode' expects one of 'captured', 'captured+forecast', got 'both' (str)"),
    ("level", True, "argument 'level' expects one of 0, 1, got True (bool)"),
    ("level", 1.0, "argument 'level' expects one of 0, 1, got 1.0 (float)"),
    ("fracs", [1, "x"], "argument 'fracs' expects list of float or None, got [1, 'x'] (list): item 1 does not fit"),
    ("fracs", 0.5, "argument 'fracs' expects list of float or None, got 0.5 (float)"),
    ("delay", True, "argument 'delay' expects float or str, got True (bool)"),
    ("band", "x", "argument 'band' expects float or 'measured', got 'x' (str)"),
    ("color", "green", "argument 'color' expects one of 'red', 'blue', got 'green' (str)"),
    ("folder", 3, "argument 'folder' expects Path or None, got 3 (int)"),
    ("workers", "abc", "argument 'workers' expects int or None, got 'abc' (str)"),
    ("sizes", [1, "2.5", True],
     "argument 'sizes' expects list of float, got [1, '2.5', True] (list): items 1, 2 do not fit"),
])
def test_a_value_of_another_type_is_refused_with_the_expected_type(key, value, expected):
    assert _error(Typed, {key: value}) == f"controller 'Typed': {expected}"


def test_unknown_arguments_list_the_accepted_ones():
    accepted = "n, x, flag, label, mode, level, fracs, delay, band, workers, sizes, anything, json, color, folder"
    assert _error(Typed, {"nn": 1}) == f"controller 'Typed': unknown argument 'nn' (accepted: {accepted})"
    assert _error(Typed, {"a": 1, "n": 1, "b": 2}).startswith("controller 'Typed': unknown arguments 'a', 'b' (")
    assert _error(NoInit, {"a": 1}) == "controller 'NoInit': unknown argument 'a' (accepted: none)"


def test_every_problem_is_named_in_one_message_in_the_order_given():
    msg = _error(Typed, {"x": "abc", "zz": 1, "label": "fine", "n": True})
    assert msg.startswith("controller 'Typed': unknown argument 'zz' (accepted: ")
    assert msg.endswith("; argument 'x' expects float, got 'abc' (str); argument 'n' expects int, got True (bool)")
    assert "\n" not in msg


def test_missing_required_arguments_are_named_and_defaults_are_not_copied():
    assert _error(Needs, {}) == "controller 'Needs': missing argument 'target' (float)"
    assert check_kwargs(_res(Needs), {"target": 2}) == {"target": 2.0}  # the lock default is left alone
    cfg = config_model_of(Needs)
    default = cfg.model.model_fields[cfg.fields["lock"]].get_default(call_default_factory=True)
    assert default is Needs.__init__.__defaults__[0]


def test_a_json_number_or_boolean_for_a_str_parameter_is_its_text_as_typed():
    raw = {"label": "123", "delay": "5", "anything": "7", "mode": "captured"}
    out = check_kwargs(_res(Typed), {"label": 123, "delay": 5, "anything": 7, "mode": "captured"}, raw)
    assert out == {"label": "123", "delay": 5.0, "anything": 7, "mode": "captured"}  # a number fits float | str
    assert check_kwargs(_res(Typed), {"label": None}, {"label": "null"}) == {"label": "null"}
    assert check_kwargs(_res(Typed), {"label": True}, {"label": "true"}) == {"label": "true"}
    # a text that does not fit either is shown as typed, with what it parsed as
    assert _error(Typed, {"n": True}, {"n": "true"}) == "controller 'Typed': argument 'n' expects int, got true (bool)"
    assert (_error(Typed, {"x": "half"}, {"x": "half"}) ==
            "controller 'Typed': argument 'x' expects float, got half (str)")
    # lists and objects are not turned back into text
    assert "argument 'label' expects str, got [1] (list)" in _error(Typed, {"label": [1]}, {"label": "[1]"})


def test_unannotated_any_and_unresolvable_annotations_take_anything():
    assert check_kwargs(_res(Typed), {"anything": object})["anything"] is object
    assert check_kwargs(_res(Unresolved), {"spec": [1, "x"], "n": 2}) == {"spec": [1, "x"], "n": 2}
    assert _error(Unresolved, {"n": "2"}) == "controller 'Unresolved': argument 'n' expects int, got '2' (str)"


def test_a_kwargs_controller_accepts_other_keys_unchecked():
    given = {"level": 2, "other": "x", "more": [1]}
    assert check_kwargs(_res(Extra), given) == given
    assert (_error(Extra, {"level": 0.5, "other": 1}) ==
            "controller 'Extra': argument 'level' expects int, got 0.5 (float)")


def test_the_model_is_built_once_per_target_and_a_target_without_signature_is_not_checked():
    assert config_model_of(Typed) is config_model_of(Typed)
    assert config_model_of(dict) is None
    assert check_kwargs(Resolved("d", "d", "test", dict, dict), {"a": 1}) == {"a": 1}


# ------------------------------------------------------------------------------------------ config_model
def test_a_declared_config_model_is_used_as_written():
    out = check_kwargs(_res(Declared), {"horizon_s": 30, "mode": "b"})
    assert out == {"horizon_s": 30.0, "mode": "b"} and type(out["horizon_s"]) is float
    assert Declared(**out).cfg.horizon_s == 30.0
    assert (_error(Declared, {"horizon_s": -1}) ==
            "controller 'Declared': argument 'horizon_s' expects float, got -1 (int): Input should be greater than 0")
    assert (_error(Declared, {"mode": "c"}) ==
            "controller 'Declared': argument 'mode' expects one of 'a', 'b', got 'c' (str)")
    # its fields, not the constructor's **kwargs, say what is accepted
    assert (_error(Declared, {"other": 1}) ==
            "controller 'Declared': unknown argument 'other' (accepted: horizon_s, mode)")
    # its own (lax) mode decides: a numeric text is a float for it
    assert check_kwargs(_res(Declared), {"horizon_s": "5"}) == {"horizon_s": 5.0}


def test_a_config_model_that_is_not_a_pydantic_model_is_an_error():
    class Wrong(_Acts):
        config_model = dict

    with pytest.raises(ValueError, match=r"config_model must be a pydantic BaseModel subclass"):
        check_kwargs(_res(Wrong), {})


# ------------------------------------------------------------------------------------------ built-ins
def test_builtin_controllers_are_checked_by_their_signatures():
    import commitenv_controllers  # noqa: F401  (registers the built-ins)

    assert (_builtin_error("epact", {"workers": "abc"}) ==
            "controller 'epact': argument 'workers' expects int or None, got 'abc' (str)")
    assert check_kwargs(resolve("epact"), {"workers": 2, "planning_delay": "measured", "nominal": [1, 0.5]}) == {
        "workers": 2, "planning_delay": "measured", "nominal": [1.0, 0.5]}
    out = check_kwargs(resolve("dynamollm"), {"headroom": 1.2, "replan_s": 900})
    assert out == {"headroom": 1.2, "replan_s": 900.0} and type(out["replan_s"]) is float
    assert "argument 'pool_clock' expects bool, got 1 (int)" in _builtin_error("dynamollm", {"pool_clock": 1})
    assert "unknown argument 'static_target'" in _builtin_error("static_target", {"static_target": False})


def _builtin_error(name: str, kwargs: dict[str, Any]) -> str:
    with pytest.raises(ValueError) as e:
        check_kwargs(resolve(name), kwargs)
    return str(e.value)


def test_cli_names_every_bad_controller_argument_on_one_error_line(capsys):
    rc = main(["run", HOUR_SCENARIO, "--controller", "epact", "--controller-arg", "workers=abc",
               "--controller-arg", "slo_scope=1", "--controller-arg", "max_tail_s=true", "--quiet"])
    out, err = capsys.readouterr()
    assert rc == 2
    lines = err.strip().splitlines()
    assert lines == ["error: controller 'epact': argument 'workers' expects int or None, got abc (str); "
                     "argument 'slo_scope' expects one of 'captured', 'captured+forecast', got 1 (int); "
                     "argument 'max_tail_s' expects float, got true (bool)"]  # a number, and no choice
    assert "Traceback" not in out + err
