"""minfer-server: an OpenAI- and Ollama-compatible HTTP server over one minfer Engine.

import minfer
from minfer_server import create_app, serve
engine = minfer.load()
serve(engine, host="127.0.0.1", port=8080)      # or: uvicorn with create_app(engine)

`minfer serve` (minfer's command line) loads the model and calls `serve`.
"""

from __future__ import annotations

from minfer_server.app import create_app
from minfer_server.server import serve

__version__ = "0.1.0"
__all__ = ["create_app", "serve"]
