"""Min-of-keys selection (CLAIMS E3): retrieve the value of the key maximizing ``min(k1, k2)``
among 8 keys with a fixed query. One scaled dot-product attention layer with a skip connection
and a linear readout, without LayerNorm (which would add a nonlinearity of its own)."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="min_of_keys",
        task=tasks.get("min_of_keys").config(num_keys=8, num_values=8),
        model=dict(kind="transformer", width=32, layers=1, heads=1, mlp=False, norms=False),
        optim=OptimConfig(learning_rate=3e-3),
        train=TrainConfig(
            steps=10 if smoke else 800,
            eval_every=10 if smoke else 200,
            batch_size=128,
            eval_batch_size=32 if smoke else 2048,
        ),
    )
