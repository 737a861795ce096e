"""commitenv: energy-commitment tracking for LLM serving (Gymnasium environment, engine, controllers).

Importing the package registers every shipped scenario as a Gymnasium id ``commitenv/<name>-v0``.
"""

from commitenv._version import __version__  # noqa: F401  (the package version, commitenv.__version__)
from commitenv.scenarios.registry import register_all as _register_all

_register_all()


def evaluate(controller, scenario, seed: int = 0, **kwargs):
    """Run ``controller`` on ``scenario`` and score it (see `commitenv.evaluation.evaluate`)."""
    from commitenv.evaluation import evaluate as _evaluate

    return _evaluate(controller, scenario, seed, **kwargs)
