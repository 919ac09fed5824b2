"""Flax NNX modules: score modules, multi-head attention, positional encodings, models."""

from attnjax.nn.attention import HeadGate, MultiHeadAttention
from attnjax.nn.positional import Learned, Sinusoidal, rope, sinusoidal
from attnjax.nn.scores import SCORE_MODULES, Score, make_score

__all__ = [
    "SCORE_MODULES",
    "HeadGate",
    "Learned",
    "MultiHeadAttention",
    "Score",
    "Sinusoidal",
    "make_score",
    "rope",
    "sinusoidal",
]
