"""Head pruning (CLAIMS M2): a 2-layer, 8-heads-per-layer causal transformer trained on an
order-2 Markov language, whose exact bigram loss is the floor of a model without attention
(smoke: 2 heads per layer)."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="head_pruning",
        task=tasks.get("markov").config(vocab_size=16, order=2, num_successors=4, seq_len=32),
        model=dict(
            kind="transformer",
            width=64,
            layers=2,
            heads=2 if smoke else 8,
            causal=True,
            positional="learned",
            max_len=32,
        ),
        optim=OptimConfig(learning_rate=3e-3, warmup_steps=0 if smoke else 50),
        train=TrainConfig(
            steps=10 if smoke else 800,
            eval_every=10 if smoke else 200,
            batch_size=64,
            eval_batch_size=64 if smoke else 512,
        ),
    )
