"""Magnitude impostor (CLAIMS E4): find the key pointing along the query among 8 keys, one of
them an impostor at cosine 0.5 and a given norm. One attention layer, skip connection, linear
readout, no LayerNorm: a pre-attention LayerNorm would normalize the impostor's norm away."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="impostor",
        task=tasks.get("impostor").config(dim=8, num_keys=8, impostor_norm=10.0),
        model=dict(
            kind="transformer", width=32, layers=1, heads=1, score="dot", mlp=False, norms=False
        ),
        optim=OptimConfig(learning_rate=3e-3),
        train=TrainConfig(
            steps=10 if smoke else 600,
            eval_every=10 if smoke else 150,
            batch_size=128,
            eval_batch_size=32 if smoke else 2048,
        ),
    )
