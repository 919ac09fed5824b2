"""Head diversity (CLAIMS M1): min-of-keys selection (8 keys, 8 values) with one attention
layer of 4 heads (width 32, head size 8), an MLP and no LayerNorm, as in CLAIMS E3 (where two
dot-product heads plus an MLP stayed at the single-direction limit); the experiment varies the
number of heads and the diversity penalty."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="head_diversity",
        task=tasks.get("min_of_keys").config(num_keys=8, num_values=8),
        model=dict(kind="transformer", width=32, layers=1, heads=4, mlp=True, norms=False),
        optim=OptimConfig(learning_rate=1e-3),
        train=TrainConfig(
            steps=10 if smoke else 400,
            eval_every=10 if smoke else 200,
            batch_size=128,
            eval_batch_size=64 if smoke else 1024,
        ),
    )
