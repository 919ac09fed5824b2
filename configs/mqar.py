"""Multi-query associative recall (CLAIMS E6), Zoology's setting scaled down for a CPU:
vocabulary 64, length 32, 4 key-value pairs, 600 steps. Causal transformer with RoPE, MLP and
LayerNorm; the experiment varies depth and width."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    return ExperimentConfig(
        name="mqar",
        task=tasks.get("mqar").config(vocab_size=64, seq_len=32, num_pairs=4),
        model=dict(kind="transformer", width=64, layers=2, heads=1, positional="rope", causal=True),
        optim=OptimConfig(learning_rate=1e-3),
        train=TrainConfig(
            steps=10 if smoke else 600,
            eval_every=10 if smoke else 150,
            batch_size=64,
            eval_batch_size=32 if smoke else 1024,
            fast_compile=smoke,  # long runs: optimized programs (XLA level 1)
        ),
    )
