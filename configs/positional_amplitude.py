"""Positional amplitude (CLAIMS S7): a causal one-layer transformer (width 32, one head, MLP,
no LayerNorm, so the amplitude reaches the attention logits unnormalized, as in the first layer
of a post-LN transformer) on an order-2 Markov language over 8 tokens: the next token depends on
the current and the previous token, so attention must find position t − 1."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="positional_amplitude",
        task=tasks.get("markov").config(vocab_size=8, order=2, num_successors=2, seq_len=16),
        model=dict(
            kind="transformer",
            width=32,
            layers=1,
            heads=1,
            causal=True,
            norms=False,
            positional="sinusoidal",
            max_len=32,
        ),
        optim=OptimConfig(learning_rate=3e-3),
        train=TrainConfig(
            steps=10 if smoke else 400,
            eval_every=10 if smoke else 200,
            batch_size=32,
            eval_batch_size=64 if smoke else 1024,
        ),
    )
