"""A compact joint distribution of (prompt, output) lengths, fitted from a trace and shipped as JSON.

The prompt marginal is stored as quantiles on a probability grid. Requests are ranked by prompt length and
split into ``n_bins`` equal-count groups; each group stores quantiles of its output lengths. Sampling draws
``u ~ U(0,1)``: the prompt is the inverse CDF at ``u`` and the output comes from group ``floor(u * n_bins)``
at an independent ``v ~ U(0,1)``, so the prompt/output dependence of the source survives. Inverse CDFs
interpolate linearly in log space between stored quantiles and are rounded to whole tokens (>= 1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from .table import RequestTable, WorkloadError

FORMAT = "commitenv.empirical_lengths/1"
DATA_DIR = Path(__file__).resolve().parent / "data"
# Dense in the tails, where serving cost lives: p99 and p99.5 are stored points, not interpolated.
_TAILS = [0.0, 0.005, 0.01, 0.025]
PROMPT_PROBS = tuple(sorted(set(_TAILS + [round(x, 3) for x in np.arange(0.05, 0.951, 0.025)]
                                 + [1 - x for x in _TAILS])))
OUTPUT_PROBS = tuple(sorted(set(_TAILS + [round(x, 3) for x in np.arange(0.05, 0.951, 0.05)]
                                 + [1 - x for x in _TAILS])))


def _log_inverse_cdf(u: np.ndarray, probs: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    return np.exp(np.interp(u, probs, log_q))


@dataclass(frozen=True, eq=False)
class EmpiricalLengths:
    """Joint (prompt, output) length distribution; see the module docstring for the model.

    ``context_limit`` (optional) caps every sample: prompt <= limit - 1 and prompt + output <= limit.
    """

    prompt_probs: np.ndarray  # (K,) increasing, 0 .. 1
    prompt_quantiles: np.ndarray  # (K,) non-decreasing, >= 1
    output_probs: np.ndarray  # (J,) increasing, 0 .. 1
    output_quantiles: np.ndarray  # (n_bins, J) non-decreasing rows, >= 1
    context_limit: int | None = None
    source: str = "<memory>"
    summary: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("prompt_probs", "prompt_quantiles", "output_probs", "output_quantiles"):
            arr = np.array(getattr(self, name), dtype=np.float64)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        pp, pq, op, oq = self.prompt_probs, self.prompt_quantiles, self.output_probs, self.output_quantiles
        problems = []
        for label, probs in (("prompt_probs", pp), ("output_probs", op)):
            if probs.ndim != 1 or len(probs) < 2 or probs[0] != 0.0 or probs[-1] != 1.0 or np.any(np.diff(probs) <= 0):
                problems.append(f"{label} must increase strictly from 0 to 1")
        if pq.shape != pp.shape:
            problems.append(f"prompt_quantiles has shape {pq.shape}, expected {pp.shape}")
        if oq.ndim != 2 or oq.shape[1:] != op.shape or oq.shape[0] < 1:
            problems.append(f"output_quantiles has shape {oq.shape}, expected (n_bins, {len(op)})")
        if not problems:
            for label, q in (("prompt_quantiles", pq), ("output_quantiles", oq)):
                if not np.all(np.isfinite(q)) or np.any(q < 1) or np.any(np.diff(q, axis=-1) < 0):
                    problems.append(f"{label} must be finite, >= 1 and non-decreasing")
        if self.context_limit is not None and self.context_limit < 2:
            problems.append(f"context_limit {self.context_limit} must be >= 2")
        if problems:
            raise WorkloadError(f"{self.source}: invalid length table: " + "; ".join(problems))

    @property
    def n_bins(self) -> int:
        return int(self.output_quantiles.shape[0])

    @classmethod
    def from_table(
        cls, table: RequestTable, *, n_bins: int = 8, prompt_probs=PROMPT_PROBS, output_probs=OUTPUT_PROBS,
        source: str | None = None,
    ) -> "EmpiricalLengths":
        """Fit from a request table (needs at least ``n_bins`` requests)."""
        n = len(table)
        if n < n_bins:
            raise WorkloadError(f"{table.source}: {n} requests are too few for {n_bins} length bins")
        p = table.prompt_tokens.astype(np.float64)
        o = table.output_tokens.astype(np.float64)
        order = np.argsort(p, kind="stable")
        groups = np.array_split(order, n_bins)
        oq = np.stack([np.quantile(o[g], output_probs) for g in groups])
        summary = {
            "n_requests": n,
            "prompt": {"mean": float(p.mean()), "median": float(np.median(p)), "p99": float(np.quantile(p, 0.99))},
            "output": {"mean": float(o.mean()), "median": float(np.median(o)), "p99": float(np.quantile(o, 0.99))},
        }
        return cls(np.asarray(prompt_probs), np.quantile(p, prompt_probs), np.asarray(output_probs), oq,
                   source=source or table.source, summary=summary)

    def with_context_limit(self, context_limit: int | None) -> "EmpiricalLengths":
        """The same distribution, capped to ``context_limit`` tokens (prompt + output) at sampling."""
        return replace(self, context_limit=context_limit)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt, output) pairs as int64 arrays, deterministic given ``rng``'s state."""
        u = rng.random(n)
        v = rng.random(n)
        prompt = np.rint(_log_inverse_cdf(u, self.prompt_probs, np.log(self.prompt_quantiles))).astype(np.int64)
        bins = np.minimum((u * self.n_bins).astype(np.int64), self.n_bins - 1)
        log_oq = np.log(self.output_quantiles)
        # Per-bin inverse CDF without a Python loop: interpolate v on the grid, then pick each row's bin.
        j = np.clip(np.searchsorted(self.output_probs, v, side="right") - 1, 0, len(self.output_probs) - 2)
        p0, p1 = self.output_probs[j], self.output_probs[j + 1]
        w = (v - p0) / (p1 - p0)
        log_out = log_oq[bins, j] * (1 - w) + log_oq[bins, j + 1] * w
        output = np.rint(np.exp(log_out)).astype(np.int64)
        np.maximum(prompt, 1, out=prompt)
        np.maximum(output, 1, out=output)
        if self.context_limit is not None:
            np.minimum(prompt, self.context_limit - 1, out=prompt)
            np.minimum(output, self.context_limit - prompt, out=output)
        return prompt, output

    def to_dict(self) -> dict:
        """JSON-able form (inverse of :meth:`from_dict`)."""
        return {
            "format": FORMAT,
            "source": self.source,
            "context_limit": self.context_limit,
            "summary": self.summary,
            "n_bins": self.n_bins,
            "prompt_probs": [float(x) for x in self.prompt_probs],
            "prompt_quantiles": [round(float(x), 2) for x in self.prompt_quantiles],
            "output_probs": [float(x) for x in self.output_probs],
            "output_quantiles": [[round(float(x), 2) for x in row] for row in self.output_quantiles],
        }

    @classmethod
    def from_dict(cls, d: dict, *, where: str = "<dict>") -> "EmpiricalLengths":
        """Rebuild from :meth:`to_dict` output; ``where`` names the origin in errors."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise WorkloadError(f"{where}: not a length table (expected field format = {FORMAT!r})")
        missing = [k for k in ("prompt_probs", "prompt_quantiles", "output_probs", "output_quantiles") if k not in d]
        if missing:
            raise WorkloadError(f"{where}: length table lacks field {missing[0]!r}")
        try:
            return cls(np.asarray(d["prompt_probs"], dtype=np.float64),
                       np.asarray(d["prompt_quantiles"], dtype=np.float64),
                       np.asarray(d["output_probs"], dtype=np.float64),
                       np.asarray(d["output_quantiles"], dtype=np.float64),
                       context_limit=d.get("context_limit"), source=str(d.get("source", where)),
                       summary=dict(d.get("summary", {})))
        except (TypeError, ValueError) as e:
            if isinstance(e, WorkloadError):
                raise WorkloadError(f"{where}: {e}") from None
            raise WorkloadError(f"{where}: malformed length table ({e})") from None

    @classmethod
    def from_json(cls, path: str | Path) -> "EmpiricalLengths":
        try:
            d = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise WorkloadError(f"{path}: line {e.lineno}: bad JSON ({e.msg})") from None
        return cls.from_dict(d, where=str(path))

    def to_json(self, path: str | Path) -> None:
        """Write atomically (temporary file, then rename)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        body = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in self.to_dict().items())
        tmp.write_text("{\n" + body + "\n}\n")
        tmp.replace(path)


@lru_cache(maxsize=None)
def builtin_lengths(name: str) -> EmpiricalLengths:
    """A shipped length table by name (``azure_code`` or ``azure_conv``), from ``workload/data``."""
    path = DATA_DIR / f"{name}_lengths.json"
    if not path.is_file():
        have = sorted(p.name[: -len("_lengths.json")] for p in DATA_DIR.glob("*_lengths.json"))
        raise WorkloadError(f"no built-in length table {name!r} (have: {', '.join(have)})")
    return EmpiricalLengths.from_json(path)
