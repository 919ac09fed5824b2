import jax.numpy as jnp
import numpy as np

from attnjax import masks, tiling
from attnjax.masks import MaskSpec

T, S = 6, 9
SPEC = MaskSpec(
    is_causal=True,
    window=(3, 1),
    offset=2,
    q_lengths=jnp.array([6, 4]),
    kv_lengths=jnp.array([9, 5]),
    q_segment_ids=jnp.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 2, 2]]),
    kv_segment_ids=jnp.array([[0, 0, 0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 2, 2, 2]]),
)


def test_full_mask_matches_brute_force():
    full = np.broadcast_to(SPEC.full(T, S), (2, 1, T, S))
    q_len, kv_len = [6, 4], [9, 5]
    for b in range(2):
        for t in range(T):
            for s in range(S):
                p = t + 2
                expected = (
                    s <= p
                    and p - 3 <= s <= p + 1
                    and t < q_len[b]
                    and s < kv_len[b]
                    and SPEC.q_segment_ids[b, t] == SPEC.kv_segment_ids[b, s]
                )
                assert full[b, 0, t, s] == expected, (b, t, s)


def test_any_block_equals_the_slice_of_the_full_mask():
    full = np.broadcast_to(SPEC.full(T, S), (2, 1, T, S))
    for q0, q1, k0, k1 in [(0, 2, 0, 4), (2, 6, 3, 9), (5, 6, 0, 9), (1, 4, 7, 8)]:
        block = SPEC.block(jnp.arange(q0, q1), jnp.arange(k0, k1))
        np.testing.assert_array_equal(
            np.broadcast_to(block, (2, 1, q1 - q0, k1 - k0)), full[:, :, q0:q1, k0:k1]
        )


def test_causal_is_top_left_aligned_and_offset_supports_decoding():
    np.testing.assert_array_equal(
        masks.causal(jnp.arange(3), jnp.arange(5))[0, 0], np.tril(np.ones((3, 5), bool))
    )
    last = masks.causal(jnp.arange(1), jnp.arange(5), offset=4)
    assert last.all()


def test_window_matches_jax_nn_convention():
    w = masks.local_window(jnp.arange(10), jnp.arange(10), (3, 2))[0, 0]
    np.testing.assert_array_equal(np.nonzero(w[6])[0], [3, 4, 5, 6, 7, 8])


def test_lengths_and_combine():
    m = masks.lengths(jnp.arange(3), jnp.arange(4), jnp.array([2]), jnp.array([3]))
    expected = np.zeros((1, 1, 3, 4), bool)
    expected[0, 0, :2, :3] = True
    np.testing.assert_array_equal(m, expected)
    assert masks.combine(None, None) is None
    np.testing.assert_array_equal(masks.combine(m, None, np.ones((1, 1, 3, 4), bool)), m)
    assert MaskSpec().full(3, 4) is None


def test_block_ranges_match_brute_force():
    """Visited blocks cover every visible pair; unmasked blocks are exactly the fully visible."""
    num_q, num_k = 48, 64
    for is_causal, window, offset in [
        (True, None, 0), (True, None, 16), (False, (7, 3), -5), (True, (20, 0), 9),
        (False, None, 0),
    ]:  # fmt: skip
        spec = MaskSpec(is_causal=is_causal, window=window, offset=offset)
        full = spec.full(num_q, num_k)
        visible = np.broadcast_to(True if full is None else full, (1, 1, num_q, num_k))[0, 0]
        for bq, bk in [(8, 8), (8, 16), (16, 8)]:
            for q_start in range(0, num_q, bq):
                rows = visible[q_start : q_start + bq]
                lo, hi = tiling.key_block_range(spec, q_start, bq, bk, num_k // bk)
                full_lo, full_hi = tiling.full_key_block_range(spec, q_start, bq, bk, lo, hi)
                blocks = [rows[:, j * bk : (j + 1) * bk] for j in range(num_k // bk)]
                assert all(not b.any() for j, b in enumerate(blocks) if not lo <= j < hi)
                assert {j for j in range(lo, hi) if blocks[j].all()} == set(range(full_lo, full_hi))
            for k_start in range(0, num_k, bk):
                cols = visible[:, k_start : k_start + bk]
                lo, hi = tiling.query_block_range(spec, k_start, bq, bk, num_q // bq)
                full_lo, full_hi = tiling.full_query_block_range(spec, k_start, bq, bk, lo, hi)
                blocks = [cols[i * bq : (i + 1) * bq] for i in range(num_q // bq)]
                assert all(not b.any() for i, b in enumerate(blocks) if not lo <= i < hi)
                assert {i for i in range(lo, hi) if blocks[i].all()} == set(range(full_lo, full_hi))
