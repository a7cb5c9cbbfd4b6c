"""minfer-chat: a terminal chat app for GGUF models, on top of the minfer runtime.

    minfer-chat                      # the default model
    minfer-chat model.gguf --temp 0  # a model file, greedy

From Python: `ChatApp(ChatOptions(model="smollm2")).run()`.
"""

from minfer_chat.app import ChatApp, ChatOptions

__version__ = "0.1.0"
__all__ = ["ChatApp", "ChatOptions"]
