"""Inspection built on the hook points of :mod:`attnjax.nn.hooks`: activation patching and
direct logit attribution (:mod:`.patching`), head detectors (:mod:`.detectors`) and their
figures (:mod:`.figures`)."""

from attnjax.inspect.detectors import (
    detect_heads,
    duplicate_token_scores,
    induction_scores,
    previous_token_scores,
    repeated_tokens,
)
from attnjax.inspect.figures import pattern_grid, table_figure
from attnjax.inspect.patching import (
    LogitAttribution,
    PatchingTable,
    Table,
    logit_attribution,
    patch_heads,
    patch_positions,
)

__all__ = [
    "LogitAttribution",
    "PatchingTable",
    "Table",
    "detect_heads",
    "duplicate_token_scores",
    "induction_scores",
    "logit_attribution",
    "patch_heads",
    "patch_positions",
    "pattern_grid",
    "previous_token_scores",
    "repeated_tokens",
    "table_figure",
]
