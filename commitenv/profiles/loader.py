"""Load and validate profile YAML files; errors name the file and the offending field."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import ValidationError

from commitenv._paths import data_dir
from commitenv.profiles.schema import Profile


class ProfileError(ValueError):
    """A profile file is missing, unparsable or fails validation."""


def list_profiles() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(p.stem for p in data_dir("profiles").glob("*.yaml"))


def _resolve(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    cand = data_dir("profiles") / f"{name_or_path}.yaml"
    if not cand.exists():
        raise ProfileError(f"unknown profile '{name_or_path}'; shipped profiles: {', '.join(list_profiles())}")
    return cand


@lru_cache(maxsize=32)
def _load_cached(path: str, mtime: float) -> Profile:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path}: file not found") from None
    except yaml.YAMLError as e:
        raise ProfileError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: expected a mapping at the top level, got {type(raw).__name__}")
    try:
        return Profile.model_validate(raw)
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or '<root>'}: {err['msg']}" for err in e.errors())
        raise ProfileError(f"{path}: {errs}") from None


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a shipped profile by name (e.g. ``h20-qwen3.8-27b-fp8``) or any profile file by path."""
    path = _resolve(name_or_path)
    if not path.exists():
        raise ProfileError(f"{path}: file not found")
    return _load_cached(str(path.resolve()), path.stat().st_mtime)
