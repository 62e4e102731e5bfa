"""Model backends: one contract (models.base), one file per runtime, heavy imports lazy."""

from draftless.models.base import Model, ModelError, StreamDecoder, Tokenizer, UnsupportedModelError

__all__ = ["Model", "ModelError", "StreamDecoder", "Tokenizer", "UnsupportedModelError"]
