"""Head ordering (CLAIMS E5): R preference orders over m items; each example is a pair of
items with values, and the target is the value of each order's preferred item of the pair.
One attention layer of 8 heads (head size ``model.head_dim``, width 16), skip connection,
linear readout, no MLP or LayerNorm. The base point is MHA with heads of size 2 on two orders
of 16 items; the experiment's points vary the head size, the key/value heads (MHA 8, GQA 2,
MQA 1), the number of orders and the number of items."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="mqa_ordering",
        task=tasks.get("head_ordering").config(num_items=16, num_orders=2, num_present=2),
        model=dict(
            kind="transformer",
            width=16,
            layers=1,
            heads=8,
            head_dim=2,
            kv_heads=8,
            mlp=False,
            norms=False,
        ),
        optim=OptimConfig(learning_rate=1e-2),
        train=TrainConfig(
            steps=10 if smoke else 3000,
            eval_every=10 if smoke else 1000,
            batch_size=128,
            eval_batch_size=32 if smoke else 2048,
        ),
    )
