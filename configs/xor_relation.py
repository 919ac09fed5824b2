"""XOR relation (CLAIMS E1): retrieve the value of the key that matches the query in exactly
one of two bits. ``encoding="linear"``: raw bits through a linear map, where a bilinear score
cannot rank the relevant key first for every query; ``"embedding"``: one token per key kind."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="xor_relation",
        task=tasks.get("xor_relation").config(num_keys=8, num_values=8, encoding="linear"),
        model=dict(
            kind="transformer",
            width=32,
            layers=1,
            heads=1,
            score="scaled_dot",
            mlp=False,
            norms=False,
        ),
        optim=OptimConfig(learning_rate=3e-3),
        train=TrainConfig(
            steps=20 if smoke else 600,
            eval_every=10 if smoke else 150,
            batch_size=64,
            eval_batch_size=128 if smoke else 1024,
            fast_compile=smoke,  # 600 steps: optimized programs pay back their compile time
        ),
    )
