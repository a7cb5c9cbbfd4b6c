"""minfer: a minimal, fast LLM inference engine for GGUF models.

import minfer
model = minfer.load()                      # the default model (SmolLM2-135M-Instruct Q4_1)
for piece in model.generate("Why is the sky blue?", max_tokens=64):
    print(piece, end="", flush=True)

chat = model.chat(system="You are terse.")
print("".join(chat.send("Hi!")))           # later turns prefill only their own tokens

schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
reply = model.complete("Where is the Louvre?", grammar=minfer.Grammar.json_schema(schema))  # JSON, always

`minfer.options` holds what minfer's commands share on the command line (the parser, the model and sampling
options, their value types, the exit statuses), for a command built on minfer such as `minfer-chat`.
"""

from __future__ import annotations

from minfer import options
from minfer.chat import ChatSession, Message
from minfer.engine import Engine, ModelInfo
from minfer.errors import (
    BackendError,
    ContextOverflowError,
    EngineBusyError,
    GrammarError,
    MinferError,
    ModelFileError,
    ModelNotFoundError,
    NumericalError,
    TemplateError,
    TokenizerError,
)
from minfer.generation import Generation, GenerationStats
from minfer.grammar import Grammar
from minfer.model_store import resolve_model
from minfer.sampler import SamplingParams

__version__ = "0.1.0"
__all__ = [
    "BackendError",
    "ChatSession",
    "ContextOverflowError",
    "Engine",
    "EngineBusyError",
    "Generation",
    "GenerationStats",
    "Grammar",
    "GrammarError",
    "Message",
    "MinferError",
    "ModelFileError",
    "ModelInfo",
    "ModelNotFoundError",
    "NumericalError",
    "SamplingParams",
    "TemplateError",
    "TokenizerError",
    "load",
    "options",
    "resolve_model",
]


# Open a model (a path, a known name, or None for the default) and load its weights: Engine's arguments.
load = Engine
