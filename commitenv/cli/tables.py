"""The tables the command line prints: one line per run (``run``, ``compare``) or per controller over seeds
(``--seeds``), with the SLO gate and score notes under them."""

from __future__ import annotations

from commitenv.comparison import gate_word

_TABLE = [  # (summary key, header, width)
    ("controller", "controller", 12), ("attainment_pct", "attain_%", 12), ("mean_abs_dev_pct", "|dev|_%", 12),
    ("hours_within_5pct", "h<=5%", 12), ("cost_kwh_eq", "cost_kWh", 12), ("energy_mj", "energy_MJ", 12),
    ("commitment_mj", "commit_MJ", 12), ("misses", "misses", 8), ("rejected", "rejected", 8),
    ("slo_gate_pass", "gate", 5), ("score", "score", 9), ("wall_s", "wall_s", 12),
]


_ENERGY_ONLY_CELLS = {"mean_abs_dev_pct": "energy-only", "hours_within_5pct": "-", "commitment_mj": "-"}


def print_table(rows: list[dict]) -> None:
    """One line per run; ``gate`` is the scenario's SLO gate (every arrival hour attains >= 100 (1 - epsilon) %),
    followed by a note for every run with rejected requests. A run without commitment (``"settlement":
    "energy_only"``) shows ``energy-only`` for the deviation and ``-`` for the hours within 5 % and the commitment."""
    print("  ".join(f"{h:>{w}}" for _, h, w in _TABLE))
    for r in rows:
        cells = []
        energy_only = r.get("settlement") == "energy_only"
        for c, _, w in _TABLE:
            v = r.get(c)
            if c == "slo_gate_pass":
                cells.append(f"{gate_word(v):>{w}}")
            elif energy_only and c in _ENERGY_ONLY_CELLS:
                cells.append(f"{_ENERGY_ONLY_CELLS[c]:>{w}}")
            elif v is None:
                cells.append(f"{'-':>{w}}")
            else:
                cells.append(f"{v:>{w}.3f}" if isinstance(v, float) else f"{v!s:>{w}}")
        print("  ".join(cells))
    if any(r.get("settlement") == "energy_only" for r in rows):
        print("energy-only: no commitment; cost_kWh = lambda_plus x energy in kWh (no deviation)")
    if rows:
        print(gate_text(rows[0]))
        print(_SCORE_TEXT)
    for r in rows:
        if r.get("rejected"):
            print(f"{r['controller']}: {r['rejected']} of {r['requests']} requests rejected ({r['rejected_reason']}), "
                  f"counted as misses")


_SCORE_TEXT = ("score: 100 (cost_vllm - cost) / (cost_vllm - cost_oracle) on the same episode (vLLM 0, the hindsight "
               "optimum 100); a failed gate scores min(score, 0) - shortfall in pp (commitenv.scoring)")


def gate_text(summary: dict) -> str:
    """What the scenario's SLO gate asks, from a run's recorded objective."""
    obj = summary.get("objective") or {}
    gate = obj.get("gate") or {}
    if gate.get("kind") == "relative":
        return (f"gate: every arrival hour attains >= {obj.get('lower', 'vllm')}'s own attainment in that hour - "
                f"{gate['tolerance_pp']:g} pp (relative gate)")
    eps = obj.get("epsilon", summary.get("slo_gate_epsilon"))
    return "gate: every arrival hour attains >= " + (f"{100 * (1 - eps):g} % (epsilon {eps:g})" if eps is not None
                                                     else "the scenario's threshold")


_SEED_TABLE = [  # (metric, header, format)
    ("score", "score", ".2f"), ("attainment_pct", "attain_%", ".3f"), ("mean_abs_dev_pct", "|dev|_%", ".3f"),
    ("cost_kwh_eq", "cost_kWh", ".4f"), ("energy_mj", "energy_MJ", ".3f"), ("misses", "misses", ".1f"),
    ("rejected", "rejected", ".1f"),
]


def print_seed_table(doc: dict) -> None:
    """One line per controller: episodes, SLO gate passes, and each key metric as mean +- 95 % CI half-width."""
    w = max([10] + [len(c["controller"]) for c in doc["controllers"]])
    head = f"{'controller':>{w}}  {'n':>3}  {'gate':>6}" + "".join(f"  {h:>20}" for _, h, _ in _SEED_TABLE)
    print(head)
    for c in doc["controllers"]:
        cells = [f"{c['controller']:>{w}}", f"{c['episodes']:>3}", f"{c['slo_gate_pass_count']:>3}/{c['episodes']:<2}"]
        for k, _, fmt in _SEED_TABLE:
            m = c["metrics"].get(k)
            if m is None and k == "mean_abs_dev_pct" and doc.get("settlement") == "energy_only":
                cells.append(f"{'energy-only':>20}")
            elif m is None or m["mean"] is None:
                cells.append(f"{'-':>20}")
            elif m["half_width"] is None:
                cells.append(f"{format(m['mean'], fmt):>20}")
            else:
                cells.append(f"{format(m['mean'], fmt) + ' +- ' + format(m['half_width'], fmt):>20}")
        print("  ".join(cells))
    print(f"mean +- 95 % CI half-width (t-distribution) over seeds {seed_text(doc['seeds'])}; gate: SLO gate passes")
    print(_SCORE_TEXT)
    for c in doc["controllers"]:
        rej = c["metrics"].get("rejected")
        if rej and rej["mean"]:
            print(f"{c['controller']}: {rej['mean']:.1f} requests rejected per episode on average (prompt at or over the "
                  f"context limit), counted as misses")
    for e in doc["errors"]:
        print(f"{e['controller']} seed {e['seed']}: FAILED ({e['error']})")


def seed_text(seeds: list[int]) -> str:
    """Seeds as typed: a run of more than two consecutive seeds as ``first-last``, else comma-separated."""
    if seeds and seeds == list(range(seeds[0], seeds[0] + len(seeds))) and len(seeds) > 2:
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))
