"""The real data sets of the paper's examples, shipped with the package.

See ``README.md`` in this folder for provenance. Loaders return NumPy arrays.
"""

from __future__ import annotations

import csv
from importlib import resources

import numpy as np

__all__ = ["cancer_mortality", "sv_gbpusd"]


def _rows(name: str) -> list[dict[str, str]]:
    with resources.files(__package__).joinpath(name).open(newline="") as f:
        return list(csv.DictReader(f))


def cancer_mortality() -> tuple[np.ndarray, np.ndarray]:
    """Stomach-cancer deaths ``y`` among ``n`` at risk in 20 Missouri cities.

    Tsutakawa et al. (1985), as in the R package LearnBayes (``cancermortality``);
    the beta-binomial example of the paper (section 6.2.1).

    Returns:
      ``(y, n)``, two integer arrays of shape ``(20,)``.
    """
    rows = _rows("cancermortality.csv")
    return (
        np.array([int(r["y"]) for r in rows]),
        np.array([int(r["n"]) for r in rows]),
    )


def sv_gbpusd(source: str = "salimans_knowles") -> np.ndarray:
    """Daily % log-changes of the GBP/USD exchange rate, 1981-10-02 .. 1985-06-28 (945).

    Args:
      source: ``"salimans_knowles"`` (the paper's demeaned series) or ``"ksc"`` (the
        Kim, Shephard & Chib 1998 series, not demeaned).

    Returns:
      ``y``, float array of shape ``(945,)``.
    """
    files = {
        "salimans_knowles": "sv_gbpusd_salimans_knowles.csv",
        "ksc": "sv_gbpusd_ksc.csv",
    }
    if source not in files:
        raise ValueError(f"source must be one of {sorted(files)}, got {source!r}")
    return np.array([float(r["y"]) for r in _rows(files[source])])
