"""Attention dimension (CLAIMS S2): one attention layer of width = head size H retrieves a
value by key on the XOR-relation task with one embedding per token (solvable by every score),
so only the score's behaviour as H grows differs between points."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="dk_scaling",
        task=tasks.get("xor_relation").config(num_keys=8, num_values=8, encoding="embedding"),
        model=dict(
            kind="transformer",
            width=16,
            layers=1,
            heads=1,
            score="scaled_dot",
            mlp=False,
            norms=False,
        ),
        optim=OptimConfig(learning_rate=1e-3),
        train=TrainConfig(
            steps=10 if smoke else 300,
            eval_every=10 if smoke else 100,
            batch_size=32,
            eval_batch_size=64 if smoke else 1024,
        ),
    )
