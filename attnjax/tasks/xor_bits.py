"""XOR of two bits: ``[b1, b2, "="]`` with target ``b1 xor b2`` at ``"="``.

``b1, b2`` are independent fair bits. Int inputs ``[B, 3]``: tokens 0 and 1 are the bits, 2 is
``"="``; vocabulary 3. The target sits at ``"="`` (the last position, the only ``loss_mask``
position). Classes: 2. Chance: ``1/2``. The four inputs are equally likely, so a model right
on three of them scores 0.75; evaluation uses the four inputs once each (``all_examples``), so
accuracy takes only the values 0, 1/4, 1/2, 3/4 and 1.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from attnjax.tasks import base


@dataclasses.dataclass(frozen=True)
class XorBitsConfig:
    """No options: the task is fixed."""

    @property
    def spec(self) -> base.TaskSpec:
        return base.TaskSpec(seq_len=3, num_classes=2, chance_accuracy=0.5, vocab_size=3)


def generate(key: PRNGKeyArray, batch_size: int, config: XorBitsConfig) -> base.Batch:
    """A batch as described in the module docstring."""
    return _batch(jax.random.bernoulli(key, shape=(batch_size, 2)).astype(jnp.int32))


def all_examples(config: XorBitsConfig) -> base.Batch:
    """The four inputs, each once (``[4, 3]``)."""
    return _batch(jnp.array([[0, 0], [0, 1], [1, 0], [1, 1]], jnp.int32))


def _batch(bits: Array) -> base.Batch:
    """``[b1, b2, "="]`` for ``bits [B, 2]``, the target ``b1 xor b2`` at ``"="``."""
    inputs = jnp.concatenate([bits, jnp.full((bits.shape[0], 1), 2, jnp.int32)], axis=1)
    return base.one_target(inputs, bits[:, 0] ^ bits[:, 1])


TASK = base.Task("xor_bits", XorBitsConfig, generate, all_examples=all_examples)
