"""``commitenv calibrate``: measure a GPU x model into a profile (on a real GPU through NVML and vLLM, or on the CPU
fakes built from a profile with ``--fake``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

from commitenv.argtypes import bounded_float, clock_levels, seed

MAX_FAKE_NOISE = 1.0  # a lognormal sigma above this makes the fakes' steps meaningless (latency WAPE > 1)
WAPE_WARN = 0.25  # a validation error above this is said out loud: the profile fits its measurements poorly


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _check_writable(option: str, path: Path) -> None:
    """Before hours of measuring: ``path`` must be a file we can create, not a folder nor under a file."""
    if path.is_dir():
        raise ValueError(f"{option} {path}: is a folder; expected a file to write")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{option} {path}: cannot create it ({parent} is a file, not a folder)")
            break


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from commitenv.backends.calibrate import Grid, calibrate
    from commitenv.backends.gpu import LockedClocks
    from commitenv.profiles import load_profile

    clocks = args.clocks  # parsed and checked by argparse (commitenv.argtypes.clock_levels)
    grid = Grid(decode_contexts=(256, 1024), decode_batches=(1, 8, 32), repeats=1, idle_s=1.0) if args.quick else Grid()
    out, report = Path(args.out), Path(args.report) if args.report else None
    for opt, p in (("--out", out), ("--report", report)):
        if p is not None:
            _check_writable(opt, p)
    if args.fake_noise and not args.fake:
        raise ValueError("--fake-noise: only with --fake (the CPU fakes); a real GPU has its own noise")
    if args.fake:
        from commitenv.backends.clock import VirtualClock
        from commitenv.backends.fake_engine import SimEngine
        from commitenv.backends.fake_gpu import FakeGpu

        truth = load_profile(args.fake)
        template = load_profile(args.template) if args.template else truth
        clock = VirtualClock()
        gpu = FakeGpu(truth, clock, index=args.gpu)
        engine = SimEngine(truth, gpu, clock, noise_sigma=args.fake_noise, seed=args.seed)
    else:
        if not (args.model and args.template):
            raise ValueError("calibrate: a real GPU needs --model NAME_OR_PATH and --template PROFILE (the profile "
                             "whose model facts and scheduler limits describe the engine); --fake PROFILE runs on "
                             "the CPU fakes")
        from commitenv.backends.clock import WallClock
        from commitenv.backends.nvml import NvmlGpu
        from commitenv.backends.vllm_engine import VllmEngine

        template = load_profile(args.template)
        sch = template.scheduler
        clock = WallClock()
        gpu = NvmlGpu(args.gpu)
        engine = VllmEngine(args.model, max_num_batched_tokens=sch.token_budget, max_num_seqs=sch.max_seqs,
                            block_size=sch.block_size, max_model_len=sch.context_limit, enable_sleep_mode=True)
    with LockedClocks([gpu]):
        cal = calibrate(gpu, engine, clock, template, grid=grid, clocks_mhz=clocks, name=args.name, seed=args.seed,
                        progress=print)
    _write_atomic(out, yaml.safe_dump(cal.profile.model_dump(mode="json"), sort_keys=False))
    if report is not None:
        _write_atomic(report, json.dumps(cal.report(), indent=2) + "\n")
    v = cal.validation
    print(f"wrote {out}" + (f" and {report}" if report else "") + f"; validation latency WAPE {v['latency_wape']:.4f}, "
          f"energy WAPE {v['energy_wape']:.4f}")
    poor = [f"{k.replace('_wape', '')} WAPE {v[k]:.2f}" for k in ("latency_wape", "energy_wape") if v[k] > WAPE_WARN]
    if poor:
        print(f"warning: the profile fits its validation runs poorly ({', '.join(poor)} > {WAPE_WARN:g})"
              + (f"; --fake-noise {args.fake_noise:g} is large" if args.fake and args.fake_noise else ""),
              file=sys.stderr)
    return 0


def add_calibrate_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("calibrate", help="measure a GPU x model into a profile (microbenchmarks, NNLS fits)")
    c.add_argument("--gpu", type=int, default=0, help="the GPU index (NVML)")
    c.add_argument("--model", default=None, help="the model vLLM serves (a name or a local path)")
    c.add_argument("--template", default=None, metavar="PROFILE",
                   help="a profile giving what is not measured: model and hardware facts, scheduler limits")
    c.add_argument("--out", required=True, metavar="FILE", help="the profile YAML to write")
    c.add_argument("--report", default=None, metavar="FILE", help="also write the fits and validation as JSON")
    c.add_argument("--clocks", default=None, type=clock_levels, metavar="MHZ,...",
                   help="the levels to measure (default: the template's)")
    c.add_argument("--name", default=None, help="the new profile's name")
    c.add_argument("--quick", action="store_true", help="a smaller grid (fewer decode shapes, one repeat)")
    c.add_argument("--seed", type=seed, default=0)
    c.add_argument("--fake", default=None, metavar="PROFILE",
                   help="calibrate the CPU fakes built from PROFILE (a virtual clock; no GPU needed)")
    c.add_argument("--fake-noise", type=bounded_float(0.0, MAX_FAKE_NOISE, "a lognormal sigma"), default=0.0,
                   metavar="SIGMA", help=f"with --fake: lognormal spread of each step's time and energy (0 to "
                                         f"{MAX_FAKE_NOISE:g})")
    c.set_defaults(func=_cmd_calibrate)
