"""Composite approximations: hierarchical blocks (section 6.1)."""

from jaxvb.composite.hierarchical import (
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
