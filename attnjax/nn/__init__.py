"""Flax NNX modules: score modules, multi-head attention, positional encodings, transformer
blocks and stacks, RNN/CNN baselines, ``build(ModelConfig, rngs)``, and named hook points
(``run_with_cache``, ``run_with_hooks``)."""

from attnjax.nn.adapter import attention_fn
from attnjax.nn.attention import HeadGate, MultiHeadAttention, add_head_gates, capture_attention
from attnjax.nn.baselines import CausalCnn, Rnn, shifted_matmul_conv
from attnjax.nn.config import MODELS, ModelConfig, build, register
from attnjax.nn.generate import generate
from attnjax.nn.hooks import ActivationCache, HookContext, run_with_cache, run_with_hooks
from attnjax.nn.models import InputEmbedding, Transformer
from attnjax.nn.positional import Learned, Sinusoidal, rope, sinusoidal
from attnjax.nn.scores import SCORE_MODULES, Score, make_score
from attnjax.nn.transformer import Block, Decoder, Encoder, Mlp

__all__ = [
    "MODELS",
    "SCORE_MODULES",
    "ActivationCache",
    "Block",
    "CausalCnn",
    "Decoder",
    "Encoder",
    "HeadGate",
    "HookContext",
    "InputEmbedding",
    "Learned",
    "Mlp",
    "ModelConfig",
    "MultiHeadAttention",
    "Rnn",
    "Score",
    "Sinusoidal",
    "Transformer",
    "add_head_gates",
    "attention_fn",
    "build",
    "capture_attention",
    "generate",
    "make_score",
    "register",
    "rope",
    "run_with_cache",
    "run_with_hooks",
    "shifted_matmul_conv",
    "sinusoidal",
]
