"""Find, read and validate scenario files (``scenarios/*.yaml``).

A scenario is named three ways: its shipped name (``epact-h20-day``), its Gymnasium id
(``commitenv/epact-h20-day-v0``) or a path to a YAML file. Every problem raises :class:`ScenarioError`
whose message names the file, the field and what was expected.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from commitenv._paths import data_dir
from commitenv.scenarios.schema import Scenario, ScenarioError

ENV_NAMESPACE = "commitenv"
ENV_VERSION = 0
_ID_RE = re.compile(rf"^{ENV_NAMESPACE}/(?P<name>[^/]+?)-v(?P<version>\d+)$")


# ------------------------------------------------------------------------------------------ discovery
def scenarios_dir() -> Path | None:
    """The shipped ``scenarios/`` folder (wheel copy or checkout), or None when there is none."""
    try:
        return data_dir("scenarios")
    except FileNotFoundError:
        return None


def list_scenarios() -> list[str]:
    """Names of the shipped scenarios (file stems, which equal their ``name`` fields), sorted."""
    d = scenarios_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d is not None else []


def env_id(name: str) -> str:
    """Gymnasium id of a scenario name: ``commitenv/<name>-v0``."""
    return f"{ENV_NAMESPACE}/{name}-v{ENV_VERSION}"


def resolve_scenario(name_or_path: str | Path) -> tuple[Path, bool]:
    """The file behind a name, Gymnasium id or path, and whether it is a shipped scenario."""
    if isinstance(name_or_path, Path):
        return name_or_path, False
    s = str(name_or_path).strip()
    if s.startswith(f"{ENV_NAMESPACE}/"):
        m = _ID_RE.match(s)
        if m is None:
            raise ScenarioError(f"{s}: not a scenario id; expected '{ENV_NAMESPACE}/<name>-v{ENV_VERSION}'")
        if int(m["version"]) != ENV_VERSION:
            raise ScenarioError(f"{s}: unknown version v{m['version']} of scenario '{m['name']}'; expected v{ENV_VERSION}")
        name = m["name"]
    elif s.endswith((".yaml", ".yml")) or "/" in s or "\\" in s or Path(s).is_file():
        return Path(s), False
    else:
        name = s
    d = scenarios_dir()
    cand = d / f"{name}.yaml" if d is not None else None
    if cand is None or not cand.is_file():
        have = ", ".join(list_scenarios()) or "(none shipped)"
        raise ScenarioError(f"{s}: unknown scenario '{name}'; expected a YAML path or one of: {have}")
    return cand, True


# ------------------------------------------------------------------------------------------ reading
class _UniqueKeyLoader(yaml.SafeLoader):
    """Safe YAML loader that rejects a key given twice in one mapping (PyYAML keeps the last silently)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key '{key}' given twice (first on line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def format_validation_error(source: str, e: ValidationError) -> str:
    """``source: field: problem`` for each error pydantic found, joined by '; '."""
    parts = []
    for err in e.errors():
        where = _loc(tuple(err["loc"]))
        msg = str(err["msg"])
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field (not part of the scenario schema; check the spelling)"
        elif err["type"] not in ("value_error", "assertion_error") and not isinstance(err.get("input"), dict):
            msg = f"{msg} (got {err.get('input')!r})"
        if not where or msg.split(":", 1)[0].strip().startswith(where):
            parts.append(msg)  # the message already names its field
        else:
            parts.append(f"{where}: {msg}")
    return f"{source}: " + "; ".join(parts)


def read_yaml(path: Path, error: type[ValueError] = ScenarioError) -> object:
    """The parsed YAML of ``path`` (a key given twice in one mapping refused); problems raise ``error`` naming the
    file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except OSError as e:
        raise error(f"{path}: cannot read the file: {e}") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {e}") from None


def parse_scenario(raw: object, source: str = "<memory>") -> Scenario:
    """Validate a mapping (the parsed YAML) into a :class:`Scenario`; errors name ``source`` and the field."""
    if not isinstance(raw, dict):
        raise ScenarioError(f"{source}: expected a mapping of scenario fields at the top level, got {type(raw).__name__}")
    try:
        sc = Scenario.model_validate(raw)
    except ValidationError as e:
        raise ScenarioError(format_validation_error(source, e)) from None
    sc._source = source
    return sc


def _resolve_relative(value: str, base: Path | None) -> tuple[Path, str]:
    """A relative path is looked up next to the scenario file first, then in the current folder. Returns the
    path found (or the last candidate) and a description of where it looked."""
    p = Path(value).expanduser()
    cands = [p] if p.is_absolute() or base is None else [base / p, p]
    for c in cands:
        if c.exists():
            return c.resolve(), ""
    return cands[-1], " and ".join(str(c.absolute()) for c in cands)


def check_scenario(sc: Scenario, base_dir: Path | None = None) -> Scenario:
    """Cross-file checks the schema cannot make alone (the profile exists and has the initial clock, the
    built-in workload exists, the trace file exists). Relative profile and trace paths are resolved against
    ``base_dir`` (the scenario file's folder) and rewritten as absolute paths. Returns the checked scenario."""
    from commitenv.profiles import ProfileError, load_profile
    from commitenv.workload import list_builtin

    src = sc.source
    pool = sc.pool

    def resolved(ref: str, field: str) -> str:
        if ref.endswith((".yaml", ".yml")) or "/" in ref or "\\" in ref:
            path, looked = _resolve_relative(ref, base_dir)
            if not path.is_file():
                raise ScenarioError(f"{src}: {field}: profile file '{ref}' not found (looked at {looked or path})")
            return str(path)
        return ref

    if pool.shared:
        models = [m.model_copy(update={"profile": resolved(m.profile, f"pool.models[{i}].profile")})
                  for i, m in enumerate(pool.models)]
        if any(a.profile != b.profile for a, b in zip(models, pool.models)):
            pool = pool.model_copy(update={"models": models})
        profs = []
        for i, m in enumerate(pool.models):
            try:
                profs.append(load_profile(m.profile))
            except ProfileError as e:
                raise ScenarioError(f"{src}: pool.models[{i}].profile: {e}") from None
        levels = {tuple(p.clock_mhz) for p in profs}
        if len(levels) != 1:
            raise ScenarioError(f"{src}: pool.models: the models' profiles have different clock levels "
                                f"({sorted(levels)}); models sharing GPUs share one clock per GPU, so their profiles "
                                "must describe the same GPU")
        prof = profs[0]
    else:
        prof_ref = resolved(pool.profile, "pool.profile")
        if prof_ref != pool.profile:
            pool = pool.model_copy(update={"profile": prof_ref})
        try:
            prof = load_profile(prof_ref)
        except ProfileError as e:
            raise ScenarioError(f"{src}: pool.profile: {e}") from None
    if sc.initial.clock_mhz is not None and sc.initial.clock_mhz not in prof.clock_mhz:
        raise ScenarioError(
            f"{src}: initial.clock_mhz: {sc.initial.clock_mhz} MHz is not a clock level of profile '{prof.name}'; "
            f"expected one of {list(prof.clock_mhz)}"
        )
    wl = sc.workload
    if wl.builtin is not None and wl.builtin not in list_builtin():
        raise ScenarioError(
            f"{src}: workload.builtin: unknown built-in workload '{wl.builtin}'; expected one of: "
            f"{', '.join(list_builtin())}"
        )
    if wl.trace is not None:
        tpath, looked = _resolve_relative(wl.trace, base_dir)
        if not tpath.is_file():
            raise ScenarioError(f"{src}: workload.trace: trace file '{wl.trace}' not found (looked at {looked or tpath})")
        wl = wl.model_copy(update={"trace": str(tpath)})
    if pool is not sc.pool or wl is not sc.workload:
        sc = sc.model_copy(update={"pool": pool, "workload": wl})
    if wl.synthetic is not None and wl.synthetic.lengths_is_path:
        from commitenv.scenarios.build import synthetic_lengths

        synthetic_lengths(sc)  # the length table must exist and parse: refused at load, naming the field
    if any(v is not None for v in sc.engine.model_dump().values()):
        from commitenv.scenarios.build import scenario_profiles

        scenario_profiles(sc)  # the engine overrides must fit the profiles: refused at load, naming the field
    if sc.pool.shared:
        _check_placement_memory(sc)
    return sc


def _check_placement_memory(sc: Scenario) -> None:
    """Every placed instance must hold one request at its context limit in the memory it reserves, and a GPU's
    instances must fit its usable memory (`commitenv.sim.memory`): refused at load, naming the placement entry."""
    from commitenv.scenarios.build import scenario_layout, scenario_profiles
    from commitenv.sim.kernel.fresh import placement_memory
    from commitenv.sim.memory import PlacementMemoryError

    profs = scenario_profiles(sc)  # engine overrides applied: a shorter context limit needs less memory
    try:
        placement_memory(profs, scenario_layout(sc), where="pool.placement")
    except PlacementMemoryError as e:
        raise ScenarioError(f"{sc.source}: {e}") from None


def load_scenario(name_or_path: str | Path | Scenario) -> Scenario:
    """Load and check a scenario: a shipped name (``epact-h20-day``), a Gymnasium id
    (``commitenv/epact-h20-day-v0``), a YAML path, or an already built :class:`Scenario` (checked only)."""
    if isinstance(name_or_path, Scenario):
        return check_scenario(name_or_path)
    path, shipped = resolve_scenario(name_or_path)
    src = str(path)
    sc = parse_scenario(read_yaml(path), src)
    if shipped and sc.name != path.stem:
        raise ScenarioError(f"{src}: name: expected '{path.stem}' (the file name), got '{sc.name}'")
    return check_scenario(sc, path.resolve().parent)


def scaled_commitment(scenario: str | Path | Scenario, scale: float) -> Scenario:
    """The scenario with its commitments scaled by ``scale`` (fractions capped at 2, absolute MJ scaled), as the
    leaderboard's secret draw and the learners' demonstrations vary them; an energy-only scenario takes only 1."""
    sc = load_scenario(scenario)
    if not (math.isfinite(scale) and scale > 0):
        raise ScenarioError(f"{sc.name}: commitment scale: expected a finite number > 0, got {scale!r}")
    if sc.commitment.energy_only and scale != 1.0:
        raise ScenarioError(f"{sc.name}: commitment scale {scale}: an energy-only scenario has no commitment to scale "
                            "(expected 1.0)")
    if scale == 1.0:
        return sc
    c = sc.commitment
    if c.fractions is not None:
        upd = {"fractions": [min(2.0, f * scale) for f in c.fractions]}
    else:
        upd = {"mj": [v * scale for v in c.mj]}
    return load_scenario(sc.model_copy(update={"commitment": c.model_copy(update=upd)}))
