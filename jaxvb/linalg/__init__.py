"""O(T) linear algebra for banded and arrowhead precision matrices.

State-space posteriors (the stochastic-volatility model of the paper, sec. 6.1) have a
precision that is banded -- an AR(1) prior is tridiagonal, Gaussian sites add a
diagonal -- plus, for a few global parameters coupled to every time step, dense border
rows and columns: an arrowhead ``[[A, B], [B', C]]``. ``jaxvb.linalg.banded`` factors,
solves, samples and inverts (on the band) ``A`` in ``O(T w^2)``; ``jaxvb.linalg.arrowhead``
does the same for the whole arrowhead through the Schur complement ``C - B' A^{-1} B``.
All in pure JAX (``lax.scan``; for bandwidth 1 on an accelerator, log-depth prefix
compositions instead: see ``jaxvb.linalg.banded``), differentiable, ``jit``- and
``vmap``-compatible.

Example:
  >>> import jax.numpy as jnp
  >>> from jaxvb import linalg
  >>> ab = jnp.array([[2.0, 2.0, 2.0], [-1.0, -1.0, 0.0]])   # tridiagonal
  >>> chol = linalg.cholesky_banded(ab)
  >>> round(float(linalg.logdet_banded(chol)), 6)             # log 4
  1.386294
  >>> linalg.selected_inverse_banded(chol)[0].round(6).tolist()   # marginal variances
  [0.75, 1.0, 0.75]
"""

from jaxvb.linalg.arrowhead import (
    Arrowhead,
    ArrowheadCholesky,
    cholesky_arrowhead,
    cholesky_forward_arrowhead,
    from_dense_arrowhead,
    gaussian_arrowhead,
    is_pd_arrowhead,
    logdet_arrowhead,
    matvec_arrowhead,
    matvec_triangular_arrowhead,
    sample_arrowhead,
    selected_inverse_arrowhead,
    solve_arrowhead,
    solve_triangular_arrowhead,
    to_dense_arrowhead,
)
from jaxvb.linalg.banded import (
    Banded,
    cholesky_banded,
    from_dense,
    is_pd_banded,
    logdet_banded,
    matvec_banded,
    sample_banded,
    selected_inverse_banded,
    solve_banded,
    solve_triangular_banded,
    to_dense,
)

__all__ = [
    "Arrowhead",
    "ArrowheadCholesky",
    "Banded",
    "cholesky_arrowhead",
    "cholesky_banded",
    "cholesky_forward_arrowhead",
    "from_dense",
    "from_dense_arrowhead",
    "gaussian_arrowhead",
    "is_pd_arrowhead",
    "is_pd_banded",
    "logdet_arrowhead",
    "logdet_banded",
    "matvec_arrowhead",
    "matvec_banded",
    "matvec_triangular_arrowhead",
    "sample_arrowhead",
    "sample_banded",
    "selected_inverse_arrowhead",
    "selected_inverse_banded",
    "solve_arrowhead",
    "solve_banded",
    "solve_triangular_arrowhead",
    "solve_triangular_banded",
    "to_dense",
    "to_dense_arrowhead",
]
