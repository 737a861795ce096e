"""Leaderboard suites: which episodes a submission is scored on, read from ``leaderboard/suites/<name>.yaml``.

A public suite lists scenarios and seeds. A secret suite (``secret: true``, the ``test`` suite) lists only what may be
drawn: its episodes' scenarios, run seeds and commitment scales come from an HMAC of the maintainer's secret
(``COMMITENV_LEADERBOARD_SECRET`` or ``--secret-file``), so nobody without it can tune to them. Its run seeds lie in a
range far from every scenario's declared train and test ranges, so enumerating seeds does not find the trace.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from commitenv._paths import data_dir

SECRET_ENV = "COMMITENV_LEADERBOARD_SECRET"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Strict):
    """What one sandboxed episode may use. The planning delay the env charges for a decision is the CPU time the
    submission's process spent on it (measured by the host, not reported by the submission)."""

    cpu_s_per_decision: float = Field(default=30.0, gt=0)
    wall_s_per_decision: float = Field(default=120.0, gt=0)
    wall_s_per_episode: float = Field(default=3600.0, gt=0)
    memory_mb: int = Field(default=6144, ge=256)
    startup_s: float = Field(default=120.0, gt=0)  # to import and build the controller, and for the first decision


class PublicEpisodes(_Strict):
    scenario: str
    seeds: list[int] = Field(min_length=1)

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if any(s < 0 for s in v) or len(set(v)) != len(v):
            raise ValueError("seeds: whole numbers >= 0, each once")
        return v


class Draw(_Strict):
    """How a secret suite draws its episodes from the secret: ``per_family`` episodes from each of ``families``
    (named groups of the scenarios) for certain coverage, the rest uniformly over ``scenarios``, in a secret order."""

    scenarios: list[str] = Field(min_length=1)
    episodes: int = Field(ge=1, le=10_000)
    seed_range: tuple[int, int] = (1_000_000, 2**31 - 1)
    commitment_scale: tuple[float, float] = (1.0, 1.0)
    families: dict[str, list[str]] = Field(default_factory=dict)
    per_family: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> "Draw":
        seen: dict[str, str] = {}
        for fam, names in self.families.items():
            if not names:
                raise ValueError(f"draw.families.{fam}: expected at least one scenario")
            for n in names:
                if n not in self.scenarios:
                    raise ValueError(f"draw.families.{fam}: '{n}' is not in draw.scenarios")
                if n in seen:
                    raise ValueError(f"draw.families.{fam}: '{n}' is already in family '{seen[n]}'")
                seen[n] = fam
        if self.per_family and not self.families:
            raise ValueError("draw.per_family: needs draw.families")
        if self.per_family * len(self.families) > self.episodes:
            raise ValueError(f"draw.per_family: {self.per_family} episodes x {len(self.families)} families exceeds "
                             f"draw.episodes ({self.episodes})")
        lo, hi = self.seed_range
        if not 0 <= lo < hi:
            raise ValueError(f"draw.seed_range: expected 0 <= low < high, got [{lo}, {hi})")
        a, b = self.commitment_scale
        if not 0 < a <= b <= 2:
            raise ValueError(f"draw.commitment_scale: expected 0 < low <= high <= 2, got [{a}, {b}]")
        return self


class Suite(_Strict):
    """A suite file. ``lower`` scores 0 and ``upper`` 100 on every episode (built-in controller names)."""

    name: str
    description: str = ""
    secret: bool = False
    episodes: list[PublicEpisodes] | None = None
    draw: Draw | None = None
    lower: str = "vllm"
    upper: str = "oracle"
    limits: Limits = Limits()

    @model_validator(mode="after")
    def _check(self) -> "Suite":
        if self.secret and (self.draw is None or self.episodes is not None):
            raise ValueError("a secret suite gives 'draw' (and no 'episodes')")
        if not self.secret and (self.episodes is None or self.draw is not None):
            raise ValueError("a public suite gives 'episodes' (and no 'draw')")
        return self


@dataclass(frozen=True)
class Episode:
    """One scored episode: scenario name, run seed, commitment scale (1: the scenario's own) and a label; a secret
    suite's label is only its index, so tables and logs never print its seed, and its controller gets a seed of
    its own secret stream (``controller_seed``) rather than one derived from the run seed."""

    scenario: str
    seed: int
    commitment_scale: float = 1.0
    label: str = ""
    hidden: bool = False
    controller_seed: int | None = None


def suite_path(name_or_path: str | Path, board: Path | None = None) -> Path:
    """A suite file: a path, ``<board>/suites/<name>.yaml``, or the shipped suite of that name."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        return p
    for folder in ([board / "suites"] if board is not None else []) + [data_dir("leaderboard") / "suites"]:
        cand = folder / f"{name_or_path}.yaml"
        if cand.is_file():
            return cand
    raise ValueError(f"suite '{name_or_path}': no file suites/{name_or_path}.yaml"
                     + (f" in {board}" if board is not None else "") + " nor a shipped one")


def load_yaml_model(path: Path, model: type[BaseModel], what: str, override: dict | None = None
                    ) -> tuple[BaseModel, bytes]:
    """``model`` validated from the YAML file ``path`` (``override`` fields replacing the file's) and the file's
    bytes; ValueError naming the file, and the field with what was expected."""
    try:
        raw = path.read_bytes()
        doc = yaml.safe_load(raw)
    except OSError as e:
        raise ValueError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping of {what} fields")
    doc.update(override or {})
    try:
        return model.model_validate(doc), raw
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise ValueError(f"{path}: field {where}: {err['msg']}") from None


def load_suite(name_or_path: str | Path, board: Path | None = None) -> tuple[Suite, str]:
    """The suite and its hash (``sha256:`` of the file's bytes); ValueError naming the file and field."""
    suite, raw = load_yaml_model(suite_path(name_or_path, board), Suite, "suite")
    return suite, "sha256:" + hashlib.sha256(raw).hexdigest()


def read_secret(secret_file: str | Path | None = None) -> bytes | None:
    """The maintainer's secret from ``secret_file`` or ``$COMMITENV_LEADERBOARD_SECRET`` (None when neither)."""
    if secret_file is not None:
        try:
            data = Path(secret_file).read_bytes().strip()
        except OSError as e:
            raise ValueError(f"{secret_file}: cannot read the leaderboard secret ({e.strerror or e})") from None
        if not data:
            raise ValueError(f"{secret_file}: the leaderboard secret is empty")
        return data
    env = os.environ.get(SECRET_ENV, "").strip()
    return env.encode() if env else None


def _uniform(secret: bytes, suite_hash: str, i: int, what: str) -> float:
    """A number in [0, 1) drawn from the secret for episode ``i`` (HMAC-SHA256; one stream per ``what``)."""
    d = hmac.new(secret, f"{suite_hash}|{i}|{what}".encode(), hashlib.sha256).digest()
    return int.from_bytes(d[:8], "big") / 2**64


def episodes(suite: Suite, suite_hash: str, secret: bytes | None = None) -> list[Episode]:
    """The suite's episodes in order; a secret suite needs ``secret`` (ValueError without it)."""
    if not suite.secret:
        return [Episode(e.scenario, s, 1.0, f"{e.scenario}/{s}") for e in suite.episodes or [] for s in e.seeds]
    if not secret:
        raise ValueError(f"suite '{suite.name}' is drawn from the maintainer's secret: set ${SECRET_ENV} or pass "
                         "--secret-file")
    d = suite.draw
    assert d is not None
    # the quota slots first (each family's scenarios equally likely), then uniform slots; a secret order hides which
    pools = [names for names in d.families.values() for _ in range(d.per_family)]
    pools += [d.scenarios] * (d.episodes - len(pools))
    slots = [pool[int(_uniform(secret, suite_hash, k, "scenario") * len(pool))] for k, pool in enumerate(pools)]
    if d.per_family:  # (validated: a quota comes with its families)
        slots = [slots[k] for k in sorted(range(len(slots)), key=lambda k: _uniform(secret, suite_hash, k, "order"))]
    out = []
    for i, sc in enumerate(slots):
        lo, hi = d.seed_range
        seed = lo + int(_uniform(secret, suite_hash, i, "seed") * (hi - lo))
        a, b = d.commitment_scale
        scale = a + (b - a) * _uniform(secret, suite_hash, i, "scale")
        ctrl_seed = int(_uniform(secret, suite_hash, i, "controller") * 2**63)
        out.append(Episode(sc, seed, scale, f"episode {i}", hidden=True, controller_seed=ctrl_seed))
    return out


def seeds_hash(eps: list[Episode]) -> str:
    """A commitment to a secret suite's draw (scenarios, seeds, scales): equal hashes, equal episodes."""
    text = "\n".join(f"{e.scenario}|{e.seed}|{e.commitment_scale!r}" for e in eps)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

