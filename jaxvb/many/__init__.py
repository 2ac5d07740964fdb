"""Millions of fits, streamed to a store on disk, resumable, over many processes.

:func:`fit_many` fits one model to every data set of a collection a chunk at a time,
each chunk one :func:`jaxvb.fit_batched` call whose results are written to a store
on disk before the next chunk is loaded; :func:`load_many` reads a store back as one
batched pytree. The store's layout is in :mod:`jaxvb.many._store`'s docstring and in
the guide (``docs/guides/many-fits.md``).
"""

from jaxvb.many._fit import fit_many
from jaxvb.many._store import ManySummary, load_many

__all__ = ["ManySummary", "fit_many", "load_many"]
