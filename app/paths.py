"""Where qwenlocal keeps its files (platformdirs), with QWENLOCAL_HOME as an override. No torch."""
from __future__ import annotations

from pathlib import Path

from qwenlocal.engine.env import read_env


def data_dir() -> Path:
    home = read_env().home
    if home:
        return Path(home) / "data"
    from platformdirs import user_data_dir

    return Path(user_data_dir("qwenlocal", appauthor=False))


def models_dir() -> Path:
    return data_dir() / "models"
