"""Model backends: one contract (models.base), one file per runtime, heavy imports lazy."""

from draftless.models.base import (
    ContextFull,
    Model,
    ModelError,
    ModelSpec,
    Tokenizer,
    UnsupportedModelError,
)

__all__ = ["ContextFull", "Model", "ModelError", "ModelSpec", "Tokenizer", "UnsupportedModelError"]
