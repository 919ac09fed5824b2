"""QK-LayerNorm and the learning rate (CLAIMS S6): a 2-layer, 2-head causal transformer (width
32, head size 16, learned positions, MLP, pre-LayerNorm) on an order-2 Markov language (16
tokens, 3 successors per context, length 16) with an exact entropy rate and bigram loss.
Wortsman et al.'s (2023) recipe where the config has it: AdamW β = (0.9, 0.95), gradient
clipping at 1, 10% linear warm-up then cosine decay, z-loss 1e-4 (their independent weight
decay 1e-4 is left out: the trainer scales decay by the learning rate); diagnostics on, so
every evaluation records the max attention logit. Smoke: width 8, 1 layer, no MLP, length 8."""

from attnjax import tasks
from attnjax.experiment import ExperimentConfig, OptimConfig, TrainConfig


def get_config(variant: str | None = None) -> ExperimentConfig:
    smoke = variant == "smoke"
    steps = 10 if smoke else 400
    return ExperimentConfig(
        name="qk_norm",
        task=tasks.get("markov").config(
            vocab_size=16, order=2, num_successors=3, seq_len=8 if smoke else 16
        ),
        model=dict(
            kind="transformer",
            width=8 if smoke else 32,
            layers=1 if smoke else 2,
            heads=2,
            causal=True,
            positional="learned",
            max_len=16,
            mlp=not smoke,
        ),
        optim=OptimConfig(
            learning_rate=1e-2,
            b1=0.9,
            b2=0.95,
            clip_norm=1.0,
            warmup_steps=steps // 10,
            schedule="cosine",
        ),
        train=TrainConfig(
            steps=steps,
            eval_every=10 if smoke else 200,
            batch_size=32,
            eval_batch_size=32 if smoke else 256,
            z_loss=1e-4,
            diagnostics=True,
            fast_compile=smoke,  # long runs: optimized programs (XLA level 1)
        ),
    )
