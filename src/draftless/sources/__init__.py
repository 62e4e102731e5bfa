"""Draft sources: cheap deterministic indexes over text the model has already seen.

SamIndex / Cursor   the suffix-automaton index (conversation and frozen reference documents)
Recycling           the Token-Recycling matrix (vocab x 8 successors from verify logits)
SpeculationIndex    the cascade over all of them: the DraftSource the decoder uses
"""

from draftless.sources.base import Draft, DraftSource, Source, check_source
from draftless.sources.cascade import CascadeOptions, SpeculationIndex
from draftless.sources.recycling import Recycling
from draftless.sources.sam import Cursor, FrozenIndexError, SamIndex

__all__ = [
    "CascadeOptions",
    "Cursor",
    "Draft",
    "DraftSource",
    "FrozenIndexError",
    "Recycling",
    "SamIndex",
    "Source",
    "SpeculationIndex",
    "check_source",
]
