"""draftless: lossless speculative decoding with no draft model and no training."""

from draftless.costs import CostTable, table_for
from draftless.decoder import GenerationResult, SpecOptions, SpeculativeDecoder, generate, hold
from draftless.errors import UserError
from draftless.gate import CostGate, GateOptions
from draftless.metrics import DecodeStats, MemberStats
from draftless.models.base import ContextFull, Model, ModelError, Tokenizer
from draftless.models.registry import load_model
from draftless.sampling import SamplingOptions, sample

__all__ = [
    "ContextFull",
    "CostGate",
    "CostTable",
    "DecodeStats",
    "GateOptions",
    "GenerationResult",
    "MemberStats",
    "Model",
    "ModelError",
    "SamplingOptions",
    "SpecOptions",
    "SpeculativeDecoder",
    "Tokenizer",
    "UserError",
    "generate",
    "hold",
    "load_model",
    "sample",
    "table_for",
]

__version__ = "0.1.0"
