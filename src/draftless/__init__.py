"""draftless: lossless speculative decoding with no draft model and no training."""

from draftless.decoder import GenerationResult, SpecOptions, SpeculativeDecoder, generate
from draftless.gate import CostGate, CostTable, GateOptions
from draftless.models.base import Model, ModelError, Tokenizer
from draftless.models.registry import load_model
from draftless.sampling import SamplingOptions, sample

__all__ = [
    "CostGate",
    "CostTable",
    "GateOptions",
    "GenerationResult",
    "Model",
    "ModelError",
    "SamplingOptions",
    "SpecOptions",
    "SpeculativeDecoder",
    "Tokenizer",
    "generate",
    "load_model",
    "sample",
]

__version__ = "0.1.0"
