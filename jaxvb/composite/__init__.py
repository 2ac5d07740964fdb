"""Composite approximations: hierarchical blocks (section 6.1)."""

from jaxvb.latent.hierarchical import (
    ConditionalBlock,
    GaussianSitesBlock,
    Hierarchical,
    HierarchicalStats,
    hierarchical,
)

__all__ = [
    "ConditionalBlock",
    "GaussianSitesBlock",
    "Hierarchical",
    "HierarchicalStats",
    "hierarchical",
]
