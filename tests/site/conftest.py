from pathlib import Path

import pytest

from helpers.scenarios import toy_three_hour


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """The toy three-hour scenario (2 GPUs, 600 s intervals; commitments 0.2 / 0.5 / 0.3 MJ, rates 3 / 0.5)."""
    return toy_three_hour(tmp_path_factory.mktemp("site") / "sc")
