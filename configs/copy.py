"""Copy (CLAIMS E7): reproduce 8 symbols (of 8), each ``distance`` positions after it appeared.
The base model is a causal one-layer transformer (learned positions, MLP, LayerNorm) of width
64; the experiment swaps in GRU, LSTM and causal CNN models of the same width."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="copy",
        task=tasks.get("copy").config(length=8, distance=24, num_symbols=8),
        model=dict(
            kind="transformer", width=64, layers=1, heads=2, positional="learned", causal=True
        ),
        optim=OptimConfig(learning_rate=3e-3),
        train=TrainConfig(
            steps=10 if smoke else 600,
            eval_every=10 if smoke else 150,
            batch_size=64,
            eval_batch_size=32 if smoke else 1024,
            fast_compile=smoke,  # long runs: optimized programs (XLA level 1)
        ),
    )
