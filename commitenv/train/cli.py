"""``commitenv train``: the subcommand's parser and handler (registered by `commitenv.cli` through
`add_train_parser`; importing this module loads neither stable-baselines3 nor torch)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from commitenv.argtypes import seed
from commitenv.train import ALGORITHMS

__all__ = ["add_train_parser", "run_train"]


def add_train_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``train`` to the ``commitenv`` subcommands ``sub`` (an argparse subparsers object)."""
    t = sub.add_parser("train", help="train a stable-baselines3 policy on a scenario (needs the 'rl' extra); run it "
                                     "with --controller sb3:DIR",
                       description="Train a stable-baselines3 learner on a scenario: vectorized envs on the scenario's "
                                   "train seeds, VecNormalize, evaluation on test seeds, checkpoints; see "
                                   "docs/training.md.")
    t.add_argument("scenario", help="scenario name or file (commitenv scenarios lists them)")
    t.add_argument("--algo", choices=ALGORITHMS, default=None,
                   help="ppo / a2c (MultiDiscrete actions), sac (Box actions), dqn (one Discrete action per "
                        "(active, clock) pair), ppo-lagrangian (PPO with the miss price as an adaptive Lagrange "
                        "multiplier, docs/objective.md); default ppo")
    t.add_argument("--steps", type=int, default=None, help="environment steps in total (default 100000; with "
                                                            "--resume: the total to reach, default the run's own)")
    t.add_argument("--envs", type=int, default=None, help="parallel envs: 1 (default) in this process, more in "
                                                          "subprocesses")
    t.add_argument("--config", default=None, metavar="FILE", help="YAML of hyperparameters (docs/training.md)")
    t.add_argument("--out", required=True, metavar="DIR",
                   help="run folder: model.zip, vecnormalize.pkl, best_model.zip, train.json, checkpoints/, logs")
    t.add_argument("--resume", action="store_true",
                   help="continue the run in DIR from its last checkpoint, with the options it started with "
                        "(giving a different --algo, --envs, --seed, --eval-freq, --eval-episodes or "
                        "--checkpoint-freq is refused), up to --steps in total")
    t.add_argument("--seed", type=seed, default=None, help="the learner's own randomness (episode traces come from the "
                                                       "scenario's train seeds)")
    t.add_argument("--eval-freq", type=int, default=None, metavar="STEPS",
                   help="evaluate every STEPS environment steps (0: only at the end; default 6000)")
    t.add_argument("--eval-episodes", type=int, default=None, metavar="N",
                   help="test seeds per evaluation: the last N of the scenario's test range (0: no evaluation; "
                        "default 5)")
    t.add_argument("--checkpoint-freq", type=int, default=None, metavar="STEPS",
                   help="save a checkpoint at the first rollout boundary after every STEPS environment steps "
                        "(default 10000)")
    t.add_argument("--device", default="cpu", help="torch device (default cpu: small MLPs run fastest there)")
    t.add_argument("--torch-threads", type=int, default=1, help="torch CPU threads (default 1)")
    t.add_argument("--no-score", action="store_true",
                   help="skip scoring the final and best policies on the evaluation seeds at the end")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(func=run_train)
    return t


def run_train(args: argparse.Namespace) -> int:
    """The ``train`` subcommand: train, then print the evaluation figures and the train.json record's path."""
    from commitenv.train.trainer import TrainSpec, train

    spec = TrainSpec(scenario=args.scenario, algo=args.algo, steps=args.steps, envs=args.envs, out=args.out,
                     config=args.config, resume=args.resume, seed=args.seed, eval_freq=args.eval_freq,
                     eval_episodes=args.eval_episodes, checkpoint_freq=args.checkpoint_freq, device=args.device,
                     torch_threads=args.torch_threads, progress=not args.quiet, score=not args.no_score)
    rec = train(spec)
    print(f"{rec['status']}: {rec['steps_done']} steps of {rec['algo']} on {rec['scenario']} in {rec['wall_s']} s "
          f"(this run: {rec['segments'][-1]['wall_s']} s)")
    ev = rec.get("evaluations") or {}
    if ev:
        print(f"evaluation on test seeds {rec['eval_seeds']} (mean penalised return, the learner's: -(cost + miss "
              f"penalty x misses) + offset): final {ev['final']['mean_return']:.4f} at step {ev['final']['steps']}, "
              f"best {ev['best']['mean_return']:.4f} at step {ev['best']['steps']}")
    for which, s in (rec.get("scores") or {}).items():
        if isinstance(s, dict):
            dev = ("energy-only" if s.get("mean_abs_dev_pct") is None else f"{s['mean_abs_dev_pct']:.3f} %")
            print(f"{which:>5}: cost {s['cost_kwh_eq']:.4f} kWh-eq, attainment {s['attainment_pct']:.3f} %, misses "
                  f"{s['misses']:.1f}, |dev| {dev}")
    print(f"wrote {args.out}/train.json, model.zip, vecnormalize.pkl; run it with --controller sb3:{args.out}")
    scores = {w: {k: v for k, v in s.items() if k != "per_seed"}
              for w, s in (rec.get("scores") or {}).items() if isinstance(s, dict)}
    print(json.dumps({"status": rec["status"], "steps_done": rec["steps_done"], "wall_s": rec["wall_s"],
                      "eval_best": ev.get("best"), "eval_final": ev.get("final"), "scores": scores}))
    return 0 if rec["status"] == "finished" else 130
