"""Leaderboard submissions and limits the test files share."""

from __future__ import annotations

from pathlib import Path

import yaml

# wall limits far above the CPU ones: a loaded machine stretches wall time, not CPU time
LIMITS = {"cpu_s_per_decision": 5, "wall_s_per_decision": 60, "wall_s_per_episode": 300, "memory_mb": 2048,
          "startup_s": 60}


def write_submission(folder: Path, name: str, code: str, cls: str) -> Path:
    """A submission folder: ``code`` as ctl.py, its class ``cls`` named in submission.yaml."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ctl.py").write_text(code)
    (folder / "submission.yaml").write_text(yaml.safe_dump(
        {"name": name, "authors": ["tester"], "description": "a test", "learns": False,
         "controller": f"ctl.py:{cls}"}))
    return folder


# a controller that runs one replica at the reference clock
HALF = """
from commitenv.control import Controller
class Half(Controller):
    def act(self, observation, info):
        return self.ctx.action(1, self.ctx.reference_clock_mhz)
"""
