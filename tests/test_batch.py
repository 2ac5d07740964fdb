"""``jaxvb.fit_batched``: a vmapped fit sharded over devices equals the one-device fit.

The multi-device check runs in its own process: the number of CPU devices is fixed
when JAX starts (``--xla_force_host_platform_device_count``), and conftest has
started it already with one.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxvb

CHILD = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp, numpy as np
    import jaxvb

    q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))

    def fit_one(center, key):  # a data set (here a centre) and a key -> a fit
        def log_joint(x):
            r = x - center
            return -0.5 * jnp.sum(r**2 * jnp.array([1.0, 3.0])) - 0.05 * jnp.sum(r**4)
        return jaxvb.fit(log_joint, q0, key, num_steps=50, num_eval_draws=100)

    centers = jnp.linspace(-1.0, 1.0, 8)[:, None] * jnp.array([1.0, 2.0])
    keys = jax.random.split(jax.random.key(6), 8)
    reference = jax.jit(jax.vmap(fit_one))(centers, keys)  # one device

    def max_error(a, b):
        leaves = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
        return max(
            float(np.max(np.abs(np.asarray(u, float) - np.asarray(v, float))))
            for u, v in leaves
        )

    out = {"devices": jax.device_count(), "reference": str(reference.q.mean.sharding)}
    for size in (8, 6):  # 6 is padded to 8 (the same compiled program)
        res = jaxvb.fit_batched(fit_one, centers[:size], keys[:size])
        ref = jax.tree_util.tree_map(lambda a: a[:size], reference)
        s = res.q.mean.sharding
        out[size] = {
            "shape": list(res.q.mean.shape),
            "batch_spec": s.spec == jax.sharding.PartitionSpec("batch"),
            "devices": len(s.device_set),
            "blocks": sorted({str(sh.data.shape) for sh in res.q.mean.addressable_shards}),
            "max_error": max_error(res, ref),
            "status": np.asarray(res.status).tolist(),
        }
    # At most one fit at a time per device: the same fits, still split over devices.
    res = jaxvb.fit_batched(fit_one, centers[:6], keys[:6], batch_size=1)
    out["mapped"] = {
        "shape": list(res.q.mean.shape),
        "max_error": max_error(res, jax.tree_util.tree_map(lambda a: a[:6], reference)),
    }
    print(json.dumps(out))
    """
)


@pytest.mark.integration
def test_four_devices_shard_the_batch_and_match_one_device():
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        JAX_ENABLE_X64="1",
        XLA_FLAGS=(
            os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
        ).strip(),
    )
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 4
    assert "SingleDevice" in out["reference"]
    even, padded = out["8"], out["6"]
    # A multiple of the device count: each device holds and fitted 2 of the 8.
    assert even["shape"] == [8, 2] and even["devices"] == 4
    assert even["batch_spec"] and even["blocks"] == ["(2, 2)"]
    # 6 fits: padded to 8 for the devices, the padding dropped afterwards.
    assert padded["shape"] == [6, 2]
    for result in (even, padded):
        assert result["max_error"] < 1e-12
        assert result["status"] == [0] * len(result["status"])
    assert out["mapped"]["shape"] == [6, 2] and out["mapped"]["max_error"] < 1e-12


def test_batch_arguments_are_checked():
    fit_one = lambda key: key  # noqa: E731
    with pytest.raises(ValueError, match="at least one batched argument"):
        jaxvb.fit_batched(fit_one)
    with pytest.raises(ValueError, match="same leading"):
        jaxvb.fit_batched(lambda a, b: a, jnp.zeros(3), jnp.zeros(4))
    with pytest.raises(ValueError, match="same leading"):
        jaxvb.fit_batched(fit_one, jnp.zeros(()))
    with pytest.raises(TypeError, match="fit_one must be a function"):
        jaxvb.fit_batched(jnp.zeros(3), jnp.zeros(3))
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="batch_size must be a positive integer"):
            jaxvb.fit_batched(fit_one, jnp.zeros(3), batch_size=bad)


@pytest.mark.slow
def test_batch_size_maps_groups_and_gives_the_same_fits():
    """``batch_size=3`` over 7 fits (two groups of 3 and a remainder of 1, one after
    another) equals all 7 vmapped at once, and a ``batch_size`` of the whole batch
    is the plain vmap."""
    q0 = jaxvb.Gaussian(jnp.zeros(2), jnp.eye(2))

    def fit_one(center, key):
        def log_joint(x):
            return -0.5 * jnp.sum((x - center) ** 2) - 0.1 * jnp.sum((x - center) ** 4)

        return jaxvb.fit(log_joint, q0, key, num_steps=30, num_eval_draws=2)

    centers = jnp.linspace(-1.0, 1.0, 14).reshape(7, 2)
    keys = jax.random.split(jax.random.key(3), 7)
    whole = jaxvb.fit_batched(fit_one, centers, keys)
    for batch_size in (3, 7):
        mapped = jaxvb.fit_batched(fit_one, centers, keys, batch_size=batch_size)
        for a, b in zip(
            jax.tree_util.tree_leaves(mapped), jax.tree_util.tree_leaves(whole), strict=True
        ):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def test_one_device_and_typed_keys():
    keys = jax.random.split(jax.random.key(0), 3)
    out = jaxvb.fit_batched(
        lambda k: jax.random.normal(k, (2,)), keys, devices=jax.devices()[:1]
    )
    assert out.shape == (3, 2)
    assert jnp.array_equal(out, jax.vmap(lambda k: jax.random.normal(k, (2,)))(keys))
