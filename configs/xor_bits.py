"""XOR of two bits (CLAIMS E2): ``[b1, b2, "="]`` -> ``b1 xor b2`` at ``"="``. One attention
layer with a skip connection and a linear readout, no MLP or LayerNorm: ``readout(X + MHSA(X))``.
No positional encoding: XOR is symmetric in its bits, so the set of tokens determines it."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="xor_bits",
        task=tasks.get("xor_bits").config(),
        model=dict(kind="transformer", width=16, layers=1, heads=1, mlp=False, norms=False),
        optim=OptimConfig(learning_rate=1e-2),
        train=TrainConfig(
            steps=10 if smoke else 2000,
            eval_every=10 if smoke else 500,
            batch_size=64,
            eval_batch_size=32 if smoke else 1024,
        ),
    )
