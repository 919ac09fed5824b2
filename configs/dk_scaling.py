"""Attention dimension (CLAIMS S2): one pre-LN attention layer of fixed width retrieves the
value of the one relevant key among ``num_keys`` (the XOR-relation task, one embedding per
token), with the head size H set apart from the width. LayerNorm before attention and
projection kernels of variance 1/fan_in give q and k unit-variance coordinates at
initialization, so unscaled logits have variance ≈ H; only H and the score vary."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="dk_scaling",
        task=tasks.get("xor_relation").config(num_keys=8, num_values=16, encoding="embedding"),
        model=dict(
            kind="transformer",
            width=32,
            layers=1,
            heads=1,
            head_dim=32,
            attention_init="lecun",
            score="scaled_dot",
            mlp=False,
            norms=True,
        ),
        optim=OptimConfig(learning_rate=1e-3),
        train=TrainConfig(
            steps=10 if smoke else 400,
            eval_every=10 if smoke else 100,
            batch_size=32,
            eval_batch_size=64 if smoke else 512,
            fast_compile=smoke,
        ),
    )
