"""``commitenv site``: run controllers on a site (one per pool, each on its own or on a site-coordinated budget)
against vLLM on every pool, and print the site's bill, its saving over vLLM and the pools' gates."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from commitenv.cli.args import check_out, controller_kwargs, parse_controller_args
from commitenv.runner import RAY_LOCAL, parse_seeds

SHARED = "shared:"  # a policy shared by the pools, trained by commitenv.site.learn
_COLS = [("controller", 18), ("budget", 6), ("cost_kWh", 10), ("vs_vllm_%", 9), ("alone_kWh", 10),
         ("|dev|_%", 8), ("attain_%", 8), ("gate", 9), ("wall_s", 8)]


def add_site_parser(sub) -> None:
    """``commitenv site`` and ``commitenv sites``."""
    s = sub.add_parser("site", help="run controllers on a site of pools behind one meter (vLLM beside them)")
    s.add_argument("site", nargs="?", default="site-4pool-day", help="site name or path of a site YAML file")
    s.add_argument("--controllers", default="epact_plus",
                   help="comma-separated controller specs (vllm always runs); one per pool pattern as "
                        "SPEC@PATTERN+SPEC@PATTERN (e.g. sb3:bc-margin-h200-public@h200-*+sb3:bc-margin-h20-public@h20-*); "
                        "shared:DIR for a policy trained by python -m commitenv.site.learn")
    s.add_argument("--controller-arg", action="append", metavar="[CONTROLLER.]KEY=VALUE",
                   help="constructor argument (repeatable), for every controller or, with CONTROLLER., for one")
    s.add_argument("--budget", default="own,site",
                   help="comma-separated: own (each pool tracks its own commitment), site (a coordinator splits the "
                        "site's remaining commitment among the pools every interval), guarded (the same, but a pool "
                        "whose hour's known misses reach half its tolerance, or with a live request past its visible "
                        "deadline, keeps its own budget), proportional (the site's remaining commitment split in "
                        "proportion to each pool's draw in the hour so far)")
    s.add_argument("--seeds", default="0", metavar="LIST", help="site run seeds: 0-4, 0,3,7")
    s.add_argument("--shards", type=int, default=1, metavar="N",
                   help="with --ray: the pools split into N Ray actors stepping in lockstep (default 1)")
    s.add_argument("--ray", nargs="?", const=RAY_LOCAL, default=None, metavar="ADDRESS",
                   help="run the pools in Ray actors, on a new local Ray or on the cluster at ADDRESS (needs the 'ray' "
                        "extra)")
    s.add_argument("--router", default="fixed", metavar="POLICY",
                   help="the policy setting the split of each route under control: action, every interval: fixed (the "
                        "file's split) or efficient (load moves to the pool drawing the least energy per request while "
                        "it is not at risk); the vLLM reference runs at the file's split")
    s.add_argument("--out", default=None, help="folder for site.json (every run's site, hourly and pool summaries)")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(func=cmd_site)
    sub.add_parser("sites", help="list shipped sites").set_defaults(func=cmd_sites)


def cmd_sites(args: argparse.Namespace) -> int:
    from commitenv.site import SiteError, list_sites
    from commitenv.scenarios.loader import read_yaml
    from commitenv.site.loader import resolve_site

    for name in list_sites():
        raw = read_yaml(resolve_site(name)[0], SiteError)
        desc = raw.get("description", "") if isinstance(raw, dict) else ""
        print(f"{name:<28} {desc}")
    return 0


def cmd_site(args: argparse.Namespace) -> int:
    from commitenv.registry import resolve
    from commitenv.site import load_site
    from commitenv.site.runner import BUDGETS, pool_specs, run_site_episode, site_gates

    if args.shards < 1:
        raise ValueError(f"--shards: expected an integer >= 1, got {args.shards}")
    if args.shards > 1 and args.ray is None:
        raise ValueError("--shards: only with --ray (in this process the pools run one after another)")
    from commitenv.site.router import ROUTER_POLICIES

    if args.router not in ROUTER_POLICIES:
        raise ValueError(f"--router: expected one of {sorted(ROUTER_POLICIES)}, got {args.router!r}")
    out = check_out(args.out)
    site = load_site(args.site)
    seeds = parse_seeds(args.seeds)
    budgets = [b.strip() for b in args.budget.split(",") if b.strip()]
    bad = [b for b in budgets if b not in BUDGETS]
    if bad or not budgets:
        raise ValueError(f"--budget: expected a comma-separated list of {BUDGETS}, got {args.budget!r}")
    specs = [c.strip() for c in args.controllers.split(",") if c.strip() and c.strip() != "vllm"]
    cargs = parse_controller_args(args.controller_arg)
    kwargs = {c: controller_kwargs(resolve(c), c, cargs, scoped=True) for c in specs
              if not c.startswith(SHARED) and "@" not in c}
    for c in specs:
        if "@" in c:  # a controller per pool pattern: checked against the site's pools, no constructor arguments
            pool_specs(site, c)
            for spec in {p.rpartition("@")[0] for p in c.split("+")}:
                resolve(spec)
            kwargs[c] = {}
    for c in specs:
        if c.startswith(SHARED) and not (Path(c[len(SHARED):]) / "model.zip").is_file():
            raise ValueError(f"--controllers {c}: no model.zip in {c[len(SHARED):]} (python -m commitenv.site.learn "
                             "train ... --out DIR writes one)")
    runs = []
    print("  ".join(f"{h:>{w}}" for h, w in _COLS))
    for seed in seeds:
        ref = run_site_episode(site, "vllm", seed, progress=not args.quiet, ray_address=args.ray, shards=args.shards)
        plan = [("vllm", "own", ref)] + [(c, b, None) for c in specs for b in budgets]
        for c, b, done in plan:
            if done is not None:
                run = done
            elif c.startswith(SHARED):  # a policy shared by the pools (commitenv.site.learn): one run, no budget
                if b != budgets[0]:
                    continue
                from commitenv.site.learn import evaluate

                run = evaluate(site, c[len(SHARED):], seed)
                b = "-"
            else:
                run = run_site_episode(site, c, seed, budget=b, controller_kwargs=kwargs[c], progress=not args.quiet,
                                       ray_address=args.ray, shards=args.shards, router=args.router)
            s = run.summary
            # a router that moved requests between pools: the gates' reference is vLLM on the same requests
            gate_ref = ref if not run.splits or args.router == "fixed" else run_site_episode(
                site, "vllm", seed, progress=False, ray_address=args.ray, shards=args.shards, replay_splits=run.splits)
            gates = site_gates(run, gate_ref)
            s["gate"] = gates
            s["saving_vs_vllm_pct"] = 100.0 * (ref.summary["cost_kwh_eq"] - s["cost_kwh_eq"]) / ref.summary["cost_kwh_eq"]
            runs.append({"summary": s, "hours": run.hours, "pools": run.pools})
            n_ok = sum(g["passed"] for g in gates["pools"].values())
            label = "vllm" if done is not None else (f"shared:{Path(c[len(SHARED):]).name}" if c.startswith(SHARED) else c)
            label = label if len(label) <= 18 else label[:15] + "..."  # (site.json has the whole spec)
            cells = [label, b, f"{s['cost_kwh_eq']:.3f}", f"{s['saving_vs_vllm_pct']:.1f}",
                     f"{s['pools_alone_cost_kwh_eq']:.3f}", f"{s['mean_abs_dev_pct']:.2f}", f"{s['attainment_pct']:.3f}",
                     f"{n_ok}/{len(gates['pools'])}", f"{s['wall_s']:.0f}"]
            print("  ".join(f"{v:>{w}}" for v, (_, w) in zip(cells, _COLS)), flush=True)
    print("cost_kWh: the site's settlement cost (one meter, incl. the tail); alone_kWh: the pools' costs had each "
          "settled its own commitment; gate: pools passing their own scenario's gate (relative gates against the "
          "vLLM run of the same seed)")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (Path(out) / "site.json").write_text(json.dumps({"site": site.name, "seeds": seeds, "runs": runs}, indent=1))
    return 0
