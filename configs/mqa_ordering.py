"""Head ordering (CLAIMS E5): two preference orders over 3 items (1≻3≻2 and 2≻1≻3); report
the value of each order's top present item. One attention layer of 8 heads of size 1 (width
8), skip connection, linear readout, no MLP or LayerNorm: with key dimension 1 < 2 orders,
keys shared by all heads (MQA) admit only one order and its reverse."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="mqa_ordering",
        task=tasks.get("head_ordering").config(),
        model=dict(kind="transformer", width=8, layers=1, heads=8, mlp=False, norms=False),
        optim=OptimConfig(learning_rate=1e-2),
        train=TrainConfig(
            steps=10 if smoke else 1000,
            eval_every=10 if smoke else 250,
            batch_size=128,
            eval_batch_size=32 if smoke else 2048,
        ),
    )
