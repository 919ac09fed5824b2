"""Head ordering (CLAIMS E5): two preference orders over 16 items; each example is a pair of
items with values, and the target is the value of each order's preferred item of the pair.
One attention layer of 8 heads of size 1 (width 8), skip connection, linear readout, no MLP or
LayerNorm: with key dimension 1 < 2 orders, keys shared by all heads (MQA) admit only one
order and its reverse."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="mqa_ordering",
        task=tasks.get("head_ordering").config(num_items=16, num_orders=2, num_present=2),
        model=dict(kind="transformer", width=8, layers=1, heads=8, mlp=False, norms=False),
        optim=OptimConfig(learning_rate=1e-2),
        train=TrainConfig(
            steps=10 if smoke else 3000,
            eval_every=10 if smoke else 1000,
            batch_size=128,
            eval_batch_size=32 if smoke else 2048,
        ),
    )
