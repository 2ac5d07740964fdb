"""Saving and loading fit results: ``jaxvb.save(path, res)``, ``jaxvb.load(path)``.

**The format** (version 1). One ``.npz`` file (NumPy's zip of ``.npy`` arrays,
readable with ``numpy.load(path, allow_pickle=False)`` without jaxvb):

* ``__header__``: UTF-8 JSON as a ``uint8`` array, with ``format`` (``"jaxvb.result"``),
  ``format_version``, ``jaxvb_version``, ``wrapper`` (what the saved object was, e.g.
  a :class:`jaxvb.numpyro.NumPyroResult`, or ``null``) and ``root``: the result's
  structure, where every node is one of

  - ``{"kind": "array", "name", "dtype", "shape", "sha256"}``: the array ``name`` of
    the file, with its dtype, shape and the SHA-256 of its bytes (C order);
  - ``{"kind": "none"}``;
  - ``{"kind": "Result" | "Trace", "fields": {name: node}}``;
  - ``{"kind": "family", "class": "jaxvb.families.gaussian.Gaussian", "fields":
    {name: node}, "static": {name: JSON value}}``: a family's array fields and its
    static (non-array) fields;
  - ``{"kind": "model", "class": ...}``: a :class:`jaxvb.LatentGaussian`'s model, whose
    functions are not saved (pass ``model=`` to :func:`load`).

* the arrays, ``a0``, ``a1``, ..., in their own dtypes (float32 stays float32).

Nothing is pickled and no code is loaded: a family's class is looked up by name in a
fixed list of jaxvb's families (:data:`FAMILIES`), and :func:`load` refuses anything
else, a newer format version, and arrays whose checksum does not match. Batched
results (``jax.vmap``, :func:`jaxvb.fit_batched`) are saved like single ones, with
their leading axes.

**Code is not saved.** A :class:`jaxvb.LatentGaussian` fit's ``q(f | theta)`` is
defined by the model's functions: load it with ``load(path, model=model)``. A
:class:`jaxvb.numpyro.NumPyroResult` is saved as its :class:`jaxvb.Result`; re-wrap
the loaded one with the model::

    res = jaxvb.numpyro.NumPyroResult(jaxvb.load(path),
                                      jaxvb.numpyro.log_joint(model, *args))
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxvb._version import __version__
from jaxvb.core.result import Result, Trace
from jaxvb.families._base import build, is_concrete
from jaxvb.families.beta import Beta
from jaxvb.families.exponential import Exponential
from jaxvb.families.gamma import Gamma
from jaxvb.families.gaussian import Gaussian
from jaxvb.families.inverse_gamma import InverseGamma
from jaxvb.families.mixture import GaussianMixture
from jaxvb.latent import LatentGaussian, LatentGaussianApproximation

__all__ = ["FAMILIES", "FORMAT_VERSION", "load", "save"]

#: The format version this jaxvb writes (and the newest it reads).
FORMAT_VERSION = 1
_FORMAT = "jaxvb.result"
_HEADER = "__header__"


#: The families a file may name, by the path a file records: the only classes
#: :func:`load` builds. The paths are part of the file format, so they stay as written
#: when a class moves between modules.
FAMILIES = {
    "jaxvb.families.gaussian.Gaussian": Gaussian,
    "jaxvb.families.gamma.Gamma": Gamma,
    "jaxvb.families.beta.Beta": Beta,
    "jaxvb.families.inverse_gamma.InverseGamma": InverseGamma,
    "jaxvb.families.exponential.Exponential": Exponential,
    "jaxvb.families.mixture.GaussianMixture": GaussianMixture,
    "jaxvb.latent.LatentGaussianApproximation": LatentGaussianApproximation,
}
#: The other classes a file names (for the reader's information; never built from it).
_OTHERS = {
    LatentGaussian: "jaxvb.latent.LatentGaussian",
}
_PATHS = {cls: path for path, cls in FAMILIES.items()} | _OTHERS
#: The same for classes named by where they are defined: NumPyro is optional, so this
#: module does not import the classes that need it.
_OTHERS_BY_DEFINITION = {
    "jaxvb.interop.numpyro._result.NumPyroResult": "jaxvb.numpyro.NumPyroResult",
}


def _path(cls) -> str:
    if cls in _PATHS:
        return _PATHS[cls]
    defined = f"{cls.__module__}.{cls.__qualname__}"
    if defined in _OTHERS_BY_DEFINITION:
        return _OTHERS_BY_DEFINITION[defined]
    # a class's public path, not where it is defined
    module = cls.__module__.replace("jaxvb.interop.", "jaxvb.")
    return f"{module}.{cls.__qualname__}"


_RECORDS = {"Result": Result, "Trace": Trace}
#: The Result fields of format version 1; one added later to jaxvb's Result (a new
#: diagnostic) is NaN, "not available", when an older file lacks it.
_REQUIRED = {
    "Result": (
        "q",
        "elbo",
        "log_evidence",
        "kl",
        "r_squared",
        "residual_variance",
        "elbo_stderr",
        "khat",
        "status",
        "first_improper_step",
        "last_improper_step",
        "num_damped_steps",
        "first_nonfinite_step",
        "nonfinite_draw",
        "fixed_point_shift",
        "trace",
    ),
    "Trace": Trace._fields,
}


class _Writer:
    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}

    def encode(self, obj: Any, where: str) -> dict:
        if obj is None:
            return {"kind": "none"}
        for kind, cls in _RECORDS.items():
            if type(obj) is cls:
                return {
                    "kind": kind,
                    "fields": {
                        f: self.encode(getattr(obj, f), f"{where}.{f}") for f in cls._fields
                    },
                }
        if isinstance(obj, LatentGaussian):
            if type(obj) is not LatentGaussian:
                raise TypeError(
                    f"jaxvb.save: {where} is a {type(obj).__name__}, a model built by "
                    "jaxvb.numpyro.fit(..., latent=...); its q(f | theta) is defined by "
                    "the NumPyro model's code and cannot be rebuilt from a file yet. Save "
                    "the draws instead (res.sample), or refit."
                )
            return {"kind": "model", "class": _path(type(obj))}
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return self._family(obj, where)
        if isinstance(obj, (jax.Array, np.ndarray, np.generic, float, int, bool)):
            return self._array(obj, where)
        raise TypeError(
            f"jaxvb.save: cannot save {where}, a {type(obj).__name__}; a result holds "
            "arrays, None and jaxvb families"
        )

    def _family(self, obj, where: str) -> dict:
        path = _path(type(obj))
        if path not in FAMILIES:
            raise TypeError(
                f"jaxvb.save: {where} is a {type(obj).__name__}, which jaxvb.save does not "
                f"know how to save (it saves {', '.join(c.__name__ for c in FAMILIES.values())}"
                "); a family with functions among its fields (Hierarchical) cannot be "
                "rebuilt from a file"
            )
        fields, static = {}, {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.metadata.get("static", False):
                try:
                    json.dumps(value)
                except TypeError:
                    raise TypeError(
                        f"jaxvb.save: {where}.{f.name} ({type(value).__name__}) is not "
                        "plain data (a number, string or list) and cannot be saved"
                    ) from None
                static[f.name] = value
            else:
                fields[f.name] = self.encode(value, f"{where}.{f.name}")
        return {"kind": "family", "class": path, "fields": fields, "static": static}

    def _array(self, obj, where: str) -> dict:
        if not is_concrete(obj):
            raise TypeError(
                f"jaxvb.save: {where} is a traced value (inside jax.jit, jax.vmap or "
                "jax.grad); save the result that the traced function returns"
            )
        if isinstance(obj, jax.Array) and jax.dtypes.issubdtype(
            obj.dtype, jax.dtypes.prng_key
        ):
            raise TypeError(f"jaxvb.save: {where} is a PRNG key array, not saved")
        value = np.array(np.asarray(obj), order="C")  # 0-d stays 0-d
        if value.dtype == object:
            raise TypeError(f"jaxvb.save: {where} is not a numeric array")
        name = f"a{len(self.arrays)}"
        self.arrays[name] = value
        return {
            "kind": "array",
            "name": name,
            "dtype": value.dtype.str,
            "shape": list(value.shape),
            "sha256": hashlib.sha256(value.tobytes()).hexdigest(),
        }


def save(path: str | os.PathLike, result: Any) -> None:
    """Writes a fit's result to ``path`` (the format in this module's docstring).

    Args:
      path: the file to write (replaced if it exists; written whole or not at all).
        No suffix is added: ``result.npz`` is a good name.
      result: a :class:`jaxvb.Result` (single or batched), or a
        :class:`jaxvb.numpyro.NumPyroResult`, whose :class:`jaxvb.Result` is saved.

    Raises:
      TypeError: for what cannot be saved: a traced result, a family outside
        :data:`FAMILIES`, a ``jaxvb.numpyro`` fit with ``latent=``.

    Example:
      >>> import os, tempfile, jax, jax.numpy as jnp, jaxvb
      >>> res = jaxvb.fit(lambda x: -0.5 * jnp.sum((x - 1.0) ** 2), jnp.zeros(2),
      ...                 jax.random.key(0), num_steps=20)
      >>> path = os.path.join(tempfile.mkdtemp(), "fit.npz")
      >>> jaxvb.save(path, res)
      >>> back = jaxvb.load(path)
      >>> back.q.mean.tolist() == res.q.mean.tolist(), float(back.elbo) == float(res.elbo)
      (True, True)
    """
    wrapper = None
    if not isinstance(result, Result):
        inner = getattr(result, "result", None)
        if not (isinstance(inner, Result) and hasattr(result, "log_joint")):
            raise TypeError(
                "jaxvb.save: expected a jaxvb.Result or a jaxvb.numpyro.NumPyroResult, "
                f"got {type(result).__name__}"
            )
        lj = result.log_joint
        wrapper = {
            "class": _path(type(result)),
            "sites": list(getattr(lj, "posterior_sites", [])),
            "dim": int(getattr(lj, "dim", -1)),
        }
        result = inner
    writer = _Writer()
    header = {
        "format": _FORMAT,
        "format_version": FORMAT_VERSION,
        "jaxvb_version": __version__,
        "wrapper": wrapper,
        "root": writer.encode(result, "result"),
    }
    text = json.dumps(header, sort_keys=True).encode("utf-8")
    arrays = {_HEADER: np.frombuffer(text, np.uint8), **writer.arrays}
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".jaxvb-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class _Reader:
    def __init__(self, path: str, arrays, model: LatentGaussian | None):
        self.path, self.arrays, self.model = path, arrays, model
        self.narrowed: set[str] = set()

    def fail(self, why: str) -> ValueError:
        return ValueError(
            f"jaxvb.load: {self.path} is corrupted or not a jaxvb file: {why}"
        )

    def decode(self, node: Any, where: str) -> Any:
        if not isinstance(node, dict) or "kind" not in node:
            raise self.fail(f"the header's entry for {where} is malformed")
        kind = node["kind"]
        if kind == "none":
            return None
        if kind == "array":
            return self._array(node, where)
        if kind in _RECORDS:
            cls = _RECORDS[kind]
            fields = node.get("fields", {})
            missing = [f for f in _REQUIRED[kind] if f not in fields]
            extra = [f for f in fields if f not in cls._fields]
            if missing or extra:
                raise self.fail(
                    f"{where} has fields {sorted(fields)}, but this jaxvb's {kind} has "
                    f"{list(cls._fields)} (missing {missing}, unknown {extra})"
                )
            values = {f: self.decode(v, f"{where}.{f}") for f, v in fields.items()}
            if kind == "Result":  # diagnostics newer than the file: not available
                nan = jnp.full_like(values["elbo"], jnp.nan)
                values = {f: values.get(f, nan) for f in cls._fields}
            return cls(**values)
        if kind == "family":
            return self._family(node, where)
        if kind == "model":
            return self._model(node, where)
        raise self.fail(f"{where} is of an unknown kind {kind!r}")

    def _array(self, node: dict, where: str) -> jax.Array:
        name = node.get("name")
        if name not in self.arrays:
            raise self.fail(f"the array of {where} ({name!r}) is missing")
        value = self.arrays[name]
        if value.dtype.str != node.get("dtype") or list(value.shape) != node.get("shape"):
            raise self.fail(
                f"the array of {where} is {value.dtype.str}{list(value.shape)}, the header "
                f"says {node.get('dtype')}{node.get('shape')}"
            )
        digest = hashlib.sha256(value.tobytes()).hexdigest()
        if digest != node.get("sha256"):
            raise self.fail(f"the values of {where} do not match their checksum")
        out = jnp.asarray(value)
        if out.dtype != value.dtype:
            self.narrowed.add(f"{value.dtype} -> {out.dtype}")
        return out

    def _family(self, node: dict, where: str):
        path = node.get("class")
        cls = FAMILIES.get(path)
        if cls is None:
            raise self.fail(
                f"{where} names the class {path!r}, which is not one of the families "
                f"jaxvb.load builds ({', '.join(sorted(FAMILIES))})"
            )
        fields, static = node.get("fields", {}), node.get("static", {})
        expected = {
            f.name: f.metadata.get("static", False) for f in dataclasses.fields(cls)
        }
        given = {**{n: False for n in fields}, **{n: True for n in static}}
        if given != expected:
            raise self.fail(
                f"{where} ({cls.__name__}) has fields {sorted(given)}, but this jaxvb's "
                f"{cls.__name__} has {sorted(expected)}"
            )
        values = {n: self.decode(v, f"{where}.{n}") for n, v in fields.items()}
        return build(cls, **values, **static)

    def _model(self, node: dict, where: str):
        if self.model is None:
            raise ValueError(
                f"jaxvb.load: {self.path} holds a LatentGaussian fit, whose model (its "
                "functions) is not in the file; pass the jaxvb.LatentGaussian it was "
                "fitted with: jaxvb.load(path, model=model)"
            )
        if not isinstance(self.model, LatentGaussian):
            raise TypeError(
                f"jaxvb.load: model must be a jaxvb.LatentGaussian, got "
                f"{type(self.model).__name__}"
            )
        return self.model


def load(path: str | os.PathLike, *, model: LatentGaussian | None = None) -> Result:
    """Reads a result written by :func:`save`.

    Args:
      path: the file.
      model: for a :class:`jaxvb.LatentGaussian` fit, the model it was fitted with
        (its functions are not in the file); ignored otherwise.

    Returns:
      The :class:`jaxvb.Result`, with the saved dtypes (a float64 file read with
      ``jax_enable_x64`` off becomes float32, with a warning). A saved
      :class:`jaxvb.numpyro.NumPyroResult` comes back as its result: re-wrap it with
      ``jaxvb.numpyro.NumPyroResult(res, jaxvb.numpyro.log_joint(model, *args))``.

    Raises:
      ValueError: the file is not a jaxvb result, is damaged (checksums), was written
        by a newer jaxvb (a newer format version), or a LatentGaussian fit is loaded
        without ``model``.

    Example:
      A file that is not a result says so:

      >>> import os, tempfile, jaxvb
      >>> path = os.path.join(tempfile.mkdtemp(), "notes.npz")
      >>> with open(path, "w") as f:
      ...     _ = f.write("not a result")
      >>> jaxvb.load(path)
      Traceback (most recent call last):
      ...
      ValueError: jaxvb.load: ... is corrupted or not a jaxvb file: it is not a NumPy .npz archive (...)
    """
    path = os.fspath(path)
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise
    except Exception as e:
        raise ValueError(
            f"jaxvb.load: {path} is corrupted or not a jaxvb file: it is not a NumPy .npz "
            f"archive ({type(e).__name__}: {e})"
        ) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(
            f"jaxvb.load: {path} is corrupted or not a jaxvb file: it is not a NumPy .npz "
            "archive (a single .npy array)"
        )
    with archive:
        try:
            names = set(archive.files)
            header = json.loads(bytes(archive[_HEADER]).decode("utf-8"))
        except Exception as e:
            raise ValueError(
                f"jaxvb.load: {path} is corrupted or not a jaxvb file: its header cannot be "
                f"read ({type(e).__name__}: {e})"
            ) from None
        if not isinstance(header, dict) or header.get("format") != _FORMAT:
            raise ValueError(
                f"jaxvb.load: {path} is corrupted or not a jaxvb file: its header does not "
                f"say format {_FORMAT!r}"
            )
        version = header.get("format_version")
        if not isinstance(version, int) or version < 1:
            raise ValueError(
                f"jaxvb.load: {path} is corrupted or not a jaxvb file: format version "
                f"{version!r}"
            )
        if version > FORMAT_VERSION:
            raise ValueError(
                f"jaxvb.load: {path} was written by a newer jaxvb "
                f"({header.get('jaxvb_version')}, format version {version}); this jaxvb "
                f"({__version__}) reads format versions up to {FORMAT_VERSION}. Upgrade "
                "jaxvb to read it."
            )
        arrays = {}
        for n in sorted(names - {_HEADER}):
            try:
                arrays[n] = archive[n]
            except Exception as e:  # a damaged zip member (CRC, truncation)
                raise ValueError(
                    f"jaxvb.load: {path} is corrupted or not a jaxvb file: its array {n!r} "
                    f"cannot be read ({type(e).__name__}: {e})"
                ) from None
    reader = _Reader(path, arrays, model)
    result = reader.decode(header.get("root"), "result")
    if not isinstance(result, Result):
        raise reader.fail("its root is not a Result")
    if isinstance(result.q, LatentGaussianApproximation) and model is not None:
        if model.num_hyper is None or model.num_field is None:
            # bound as fit binds it (num_hyper and the field's length, from shapes)
            bound = model.bind(jnp.zeros_like(result.q.theta.mean))
            fields = {
                f.name: getattr(result.q, f.name) for f in dataclasses.fields(result.q)
            }
            result = result._replace(q=build(type(result.q), **{**fields, "model": bound}))
    if reader.narrowed:
        warnings.warn(
            f"jaxvb.load: {path} holds {', '.join(sorted(reader.narrowed))} arrays, but "
            "jax_enable_x64 is off: they were loaded in the narrower dtype. Call "
            "jax.config.update('jax_enable_x64', True) before loading to keep them.",
            stacklevel=2,
        )
    return result
