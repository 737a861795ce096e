"""What the engine fixes for each request of a workload when it is attached (`RequestTerms`): rejection, the
output length it runs to, the reference latency and deadline, and what a controller sees of them; shared by the
simulated pool and the hardware backend."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commitenv.profiles.schema import Profile
from commitenv.sim.lref import reference_latency
from commitenv.sim.records import EngineOptions
from commitenv.workload.table import RequestTable


@dataclass(frozen=True)
class RequestTerms:
    """What the engine fixes for every request of a workload at attach time: rejected on arrival (prompt over the
    serving model's context limit), the output length it runs to (capped at the context limit), the standalone
    reference latency L_ref, the true deadline a + alpha L_ref, the predicted output length a controller sees and
    the deadline it sees (computed from the predicted length when deadlines are predicted)."""

    rejected: np.ndarray
    out_tokens: np.ndarray
    lref: np.ndarray
    deadline: np.ndarray
    pred_out: np.ndarray
    visible_deadline: np.ndarray


def _capped_lref(profiles: list[Profile], table: RequestTable, model_of: np.ndarray,
                 out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Output lengths capped at each model's context limit, and the requests' reference latencies L_ref."""
    out = np.asarray(out).astype(np.int64)  # a copy
    lref = np.zeros(len(out))
    for m, prof in enumerate(profiles):
        sel = model_of == m
        out[sel] = np.minimum(out[sel], np.maximum(prof.scheduler.context_limit - table.prompt_tokens[sel], 1))
        lref[sel] = reference_latency(prof, table.prompt_tokens[sel], out[sel])
    return out, lref


def prediction_rng(opt: "EngineOptions") -> np.random.Generator:
    """The generator of the length-prediction errors of a run with ``opt``, at its start."""
    return np.random.default_rng(np.random.SeedSequence([opt.seed, 7919]))


def request_terms(profiles: list[Profile], opt: "EngineOptions", table: RequestTable,
                  model_of: np.ndarray, rng: np.random.Generator | None = None) -> RequestTerms:
    """The `RequestTerms` of ``table`` served by ``profiles`` (request i by model ``model_of[i]``) under ``opt``
    (SLO scale, length prediction error and bias with its seed, visible deadlines); shared by the simulated pool
    and the hardware backend, so both judge a request alike. Prediction errors come from ``rng`` when given
    (continuing it, so a workload's terms computed in arrival-ordered parts equal its terms computed whole)."""
    n = len(table)
    rejected = np.zeros(n, dtype=bool)
    for m, prof in enumerate(profiles):
        rejected |= (model_of == m) & (table.prompt_tokens >= prof.scheduler.context_limit)
    out, lref = _capped_lref(profiles, table, model_of, table.output_tokens)
    deadline = table.arrival_s + opt.alpha * lref
    s = opt.length_error_sigma
    if opt.oracle_lengths or (s == 0 and opt.length_bias == 0):
        pred_out = out.copy()
    else:
        rng = prediction_rng(opt) if rng is None else rng
        f = np.exp(s * rng.standard_normal(n) - 0.5 * s * s) * (1.0 + opt.length_bias)
        pred_out = np.maximum(1, np.rint(out * f)).astype(np.int64)
    visible = deadline
    if opt.visible_deadlines == "predicted" and not opt.oracle_lengths:
        # what an operator can state at arrival: the SLO of the predicted length (scoring keeps the true one)
        visible = table.arrival_s + opt.alpha * _capped_lref(profiles, table, model_of, pred_out)[1]
    return RequestTerms(rejected, out, lref, deadline, pred_out, visible)
