"""The Pallas kernels' dependence on JAX's Triton backend: the cached CUDA lowering check of
mods (an abstract GPU when none is attached), the backend's deprecation warning filtered
around attnjax's own lowering only, and a clear refusal on GPU once JAX drops the backend."""

import collections
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import pytest

import attnjax as aj
from attnjax import mods, scores
from attnjax.call import AttentionCall
from attnjax.pallas import mods as pallas_mods
from attnjax.pallas import triton_backend
from attnjax.pallas.mods import lowering_error


@pytest.fixture
def exports(monkeypatch):
    """A fresh lowering cache, and the list of ``jax.export.export`` calls made."""
    monkeypatch.setattr(pallas_mods, "_lowering_cache", collections.OrderedDict())
    calls = []
    export = jax.export.export

    def counting(*args, **kwargs):
        calls.append(kwargs.get("platforms"))
        return export(*args, **kwargs)

    monkeypatch.setattr(jax.export, "export", counting)
    return calls


def _call(**kwargs):
    return AttentionCall(score=scores.dot, score_params={}, **kwargs)


def test_a_second_identical_check_does_not_export_again(exports):
    call = _call(score_mod=mods.softcap(7.25))
    assert lowering_error(call) is None
    assert exports == [["cuda"]]
    assert lowering_error(call) is None
    # A mod rebuilt the same way (a new closure, as inside a training step) hits the cache.
    assert lowering_error(_call(score_mod=mods.softcap(7.25))) is None
    assert len(exports) == 1


def test_the_check_reruns_for_another_mod_or_parameter_shape(exports):
    mod = mods.relative_position_bias(num_buckets=8, max_distance=16)
    assert (
        lowering_error(_call(score_mod=mod, mod_params={"relative_bias": jnp.zeros((4, 8))}))
        is None
    )
    assert len(exports) == 1
    # Shapes that pad to the same powers of two share the check; others do not.
    assert (
        lowering_error(_call(score_mod=mod, mod_params={"relative_bias": jnp.zeros((3, 7))}))
        is None
    )
    assert len(exports) == 1
    assert (
        lowering_error(_call(score_mod=mod, mod_params={"relative_bias": jnp.zeros((4, 16))}))
        is None
    )
    assert len(exports) == 2
    assert lowering_error(_call(score_mod=mods.softcap(3.5))) is None
    assert len(exports) == 3


def test_a_mod_closing_over_an_array_is_cached_by_identity(exports):
    table = jnp.arange(4.0)

    def shifted(logits, b, h, q_idx, kv_idx, params):
        return logits + table[h]

    assert pallas_mods.mod_signature(mods.softcap(1.0)) is not None
    with pytest.raises(pallas_mods._Unhashable):
        pallas_mods.mod_signature(shifted)
    lowering_error(_call(score_mod=shifted))
    lowering_error(_call(score_mod=shifted))
    assert len(exports) == 1


def test_the_check_does_not_leak_the_triton_deprecation_warning(exports):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert lowering_error(_call(mask_mod=mods.sliding_window(5))) is None
        warnings.warn(
            "The Pallas Triton backend is deprecated (a user's own)",
            DeprecationWarning,
            stacklevel=1,
        )
    assert len(exports) == 1
    messages = [str(w.message) for w in caught]
    assert messages == ["The Pallas Triton backend is deprecated (a user's own)"]


def test_pallas_on_gpu_without_the_triton_backend_names_the_alternatives(monkeypatch):
    """As if JAX had removed ``jax.experimental.pallas.triton`` and a GPU were attached."""
    monkeypatch.setattr(triton_backend, "pl_triton", None)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    q = k = v = jnp.ones((1, 512, 2, 8))  # above CHUNKED_MIN_LOGITS
    with pytest.raises(ValueError, match=r"Triton backend.*'chunked'.*'cudnn'"):
        aj.attention(q, k, v, implementation="pallas", mask_mod=mods.causal())
    # implementation=None picks chunked where it would have picked the Pallas kernels.
    assert aj.choose_implementation(q, k, v, mask_mod=mods.causal()) == "chunked"
    monkeypatch.setattr(triton_backend, "pl_triton", object())
    assert aj.choose_implementation(q, k, v, mask_mod=mods.causal()) == "pallas"


def test_attnjax_imports_and_interprets_without_the_triton_backend():
    """A fresh interpreter where ``jax.experimental.pallas.triton`` cannot be imported: the
    package imports and the kernels still run in interpret mode off GPU."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["jax.experimental.pallas.triton"] = None  # import raises ImportError
        import jax, jax.numpy as jnp, numpy as np
        import attnjax as aj
        from attnjax.pallas import triton_backend
        assert triton_backend.pl_triton is None
        assert "chunked" in triton_backend.missing()
        q, k, v = (jax.random.normal(jax.random.key(i), (1, 8, 2, 4)) for i in range(3))
        out = aj.attention(q, k, v, implementation="pallas", is_causal=True)
        ref = aj.attention(q, k, v, implementation="xla", is_causal=True)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")
