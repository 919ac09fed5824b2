"""Inspection built on the hook points of :mod:`attnjax.nn.hooks`: activation patching and
direct logit attribution (:mod:`.patching`), head detectors (:mod:`.detectors`), their
figures (:mod:`.figures`) and a small model that grows induction heads (:mod:`.induction`)."""

from attnjax.inspect.detectors import (
    detect_heads,
    duplicate_token_scores,
    induction_scores,
    periodic_tokens,
    previous_token_scores,
    repeated_tokens,
)
from attnjax.inspect.figures import pattern_grid, table_figure, tables_figure
from attnjax.inspect.induction import (
    INDUCTION_CONFIG,
    induction_loss,
    induction_model,
    train_induction,
)
from attnjax.inspect.patching import (
    LogitAttribution,
    PatchingTable,
    Table,
    logit_attribution,
    patch_heads,
    patch_positions,
)

__all__ = [
    "INDUCTION_CONFIG",
    "LogitAttribution",
    "PatchingTable",
    "Table",
    "detect_heads",
    "duplicate_token_scores",
    "induction_loss",
    "induction_model",
    "induction_scores",
    "logit_attribution",
    "patch_heads",
    "patch_positions",
    "pattern_grid",
    "periodic_tokens",
    "previous_token_scores",
    "repeated_tokens",
    "table_figure",
    "tables_figure",
    "train_induction",
]
