"""The leaderboard: suites of episodes (`suite`), submissions (`submission`) run in a sandboxed process
(`sandbox`), scores normalized between two reference controllers behind an SLO gate (`score`), results appended with
their provenance (`results`) and rendered as LEADERBOARD.md and a static page (`render`). ``commitenv submit`` runs
it all (`submit`)."""

from commitenv.leaderboard.score import episode_score
from commitenv.leaderboard.submission import Submission, load_submission
from commitenv.leaderboard.submit import submit
from commitenv.leaderboard.suite import Episode, Limits, Suite, episodes, load_suite

__all__ = ["Episode", "Limits", "Submission", "Suite", "episode_score", "episodes", "load_submission", "load_suite",
           "submit"]
