"""The real data sets of the paper's examples, shipped with the package.

See ``README.md`` in this folder for provenance. Loaders return NumPy arrays.
"""

from __future__ import annotations

import csv
from importlib import resources

import numpy as np

__all__ = [
    "baseball_1986",
    "brambles",
    "cancer_mortality",
    "coal_mining_disasters",
    "longley",
    "radon",
    "sp500_returns",
    "sv_gbpusd",
]


def _rows(name: str) -> list[dict[str, str]]:
    with resources.files(__package__).joinpath(name).open(newline="") as f:
        return list(csv.DictReader(f))


def cancer_mortality() -> tuple[np.ndarray, np.ndarray]:
    """Stomach-cancer deaths ``y`` among ``n`` at risk in 20 Missouri cities.

    Tsutakawa et al. (1985), as in the R package LearnBayes (``cancermortality``);
    the beta-binomial example of the paper (section 6.2.1).

    Returns:
      ``(y, n)``, two integer arrays of shape ``(20,)``.

    Example:
      >>> from jaxvb import data
      >>> y, n = data.cancer_mortality()
      >>> y.shape, int(y.sum()), int(n.sum())   # 71 deaths among 71478 at risk
      ((20,), 71, 71478)
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

    Example:
      >>> from jaxvb import data
      >>> y = data.sv_gbpusd()
      >>> y.shape, round(float(y.std()), 4), round(float(y[0]), 4)
      ((945,), 0.7606, -0.3466)
      >>> round(float(data.sv_gbpusd("ksc")[0]), 4)   # the same day, not demeaned
      -0.3555
    """
    files = {
        "salimans_knowles": "sv_gbpusd_salimans_knowles.csv",
        "ksc": "sv_gbpusd_ksc.csv",
    }
    if source not in files:
        raise ValueError(f"source must be one of {sorted(files)}, got {source!r}")
    return np.array([float(r["y"]) for r in _rows(files[source])])


def longley() -> tuple[np.ndarray, np.ndarray]:
    """Longley's (1967) US macroeconomic data, 1947-1962, as in the NIST StRD file.

    ``y`` is total employment; the six columns of ``x`` are the GNP implicit price
    deflator (1954 = 100), GNP, unemployment, size of the armed forces, population
    aged 14 and over, and the year, in the units of the NIST file. The regressors are
    nearly collinear (with an intercept, the design has condition number 4.9e9): the
    NIST test of least-squares software at its "higher level of difficulty".

    Returns:
      ``(y, x)``, float arrays of shapes ``(16,)`` and ``(16, 6)``.

    Example:
      >>> from jaxvb import data
      >>> y, x = data.longley()
      >>> y.shape, x.shape, float(y[0]), x[0, -1].item()   # employment in 1947
      ((16,), (16, 6), 60323.0, 1947.0)
    """
    rows = _rows("longley.csv")
    y = np.array([float(r["y"]) for r in rows])
    x = np.array([[float(r[f"x{j}"]) for j in range(1, 7)] for r in rows])
    return y, x


def coal_mining_disasters() -> tuple[np.ndarray, np.ndarray]:
    """Yearly counts of British coal-mining disasters (10 or more killed), 1851-1962.

    The 112 counts (191 disasters) in the form of Carlin, Gelfand & Smith (1992), from
    the dates of Maguire, Pearson & Wynn (1952) as corrected by Jarrett (1979).

    Returns:
      ``(year, count)``, two integer arrays of shape ``(112,)``.

    Example:
      >>> from jaxvb import data
      >>> year, count = data.coal_mining_disasters()
      >>> int(year[0]), int(year[-1]), int(count.sum())
      (1851, 1962, 191)
    """
    rows = _rows("coal_mining_disasters.csv")
    return (
        np.array([int(r["year"]) for r in rows]),
        np.array([int(r["count"]) for r in rows]),
    )


def sp500_returns() -> np.ndarray:
    """Daily % log-returns of the S&P 500 index, 2009-01-27 .. 2018-12-31 (2500 days).

    ``y_t = 100 log(P_t / P_{t-1})`` of the adjusted close ``P`` of the last 2501
    trading days in the ``arch`` package's S&P 500 data (``arch.data.sp500``, Yahoo!
    Finance ``^GSPC``, 1999-2018), **not** demeaned (mean 0.044, sd 1.035).

    Returns:
      ``y``, float array of shape ``(2500,)``.

    Example:
      >>> from jaxvb import data
      >>> y = data.sp500_returns()
      >>> y.shape, round(float(y.mean()), 4), round(float(y.std()), 4)
      ((2500,), 0.0439, 1.0347)
    """
    return np.array([float(r["y"]) for r in _rows("sp500_returns.csv")])


def brambles() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Locations of the 823 living bramble canes in a 9 m square plot (Diggle 1983).

    Coordinates in units of 9 m (the plot is the unit square); the age of each cane:
    0 newly emerged, 1 one year old, 2 two years old. From Hutchings (1979), as in
    Diggle (1983) and the R package boot (``brambles``).

    Returns:
      ``(x, y, age)``: float, float and integer arrays of shape ``(823,)``.

    Example:
      >>> from jaxvb import data
      >>> x, y, age = data.brambles()
      >>> x.shape, bool(((0 <= x) & (x <= 1) & (0 <= y) & (y <= 1)).all())
      ((823,), True)
      >>> [int((age == a).sum()) for a in (0, 1, 2)]
      [359, 385, 79]
    """
    rows = _rows("brambles.csv")
    return (
        np.array([float(r["x"]) for r in rows]),
        np.array([float(r["y"]) for r in rows]),
        np.array([int(r["age"]) for r in rows]),
    )


def baseball_1986() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hits and times at bat of 322 Major League Baseball hitters in the 1986 season.

    With each player's number of years in the major leagues. The 1988 ASA Statistical
    Graphics and Computing data exposition's hitters data, as in the R package vcd
    (``Baseball``) and ISLR (``Hitters``).

    Returns:
      ``(hits, atbat, years)``, three integer arrays of shape ``(322,)``.

    Example:
      >>> from jaxvb import data
      >>> hits, atbat, years = data.baseball_1986()
      >>> hits.shape, int(hits.sum()), int(atbat.sum()), int(years.max())
      ((322,), 32530, 122659, 24)
    """
    rows = _rows("baseball_1986.csv")
    return (
        np.array([int(r["hits"]) for r in rows]),
        np.array([int(r["atbat"]) for r in rows]),
        np.array([int(r["years"]) for r in rows]),
    )


def radon() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Log radon in 919 Minnesota homes in 85 counties (Gelman & Hill 2007, chapter 12).

    The EPA's 1987 Minnesota survey as Gelman & Hill's radon example uses it: the log
    radon level of each home, whether it was measured on the ground floor (1) or in
    the basement (0), the county, and the county's log soil-uranium level. The
    standard data set of varying-intercept and varying-slope models.

    Returns:
      ``(log_radon, floor, county, log_uranium)``: float and integer arrays of shape
      ``(919,)``, county indices ``0..84``, and the counties' log uranium, shape
      ``(85,)``.

    Example:
      >>> from jaxvb import data
      >>> y, floor, county, u = data.radon()
      >>> y.shape, int(floor.sum()), int(county.max()) + 1, u.shape
      ((919,), 153, 85, (85,))
    """
    rows = _rows("radon_mn.csv")
    county = np.array([int(r["county"]) for r in rows])
    uranium = np.zeros(int(county.max()) + 1)
    uranium[county] = [float(r["log_uranium"]) for r in rows]
    return (
        np.array([float(r["log_radon"]) for r in rows]),
        np.array([int(r["floor"]) for r in rows]),
        county,
        uranium,
    )
