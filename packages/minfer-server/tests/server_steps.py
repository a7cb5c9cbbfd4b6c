"""What the tests share besides fixtures: the API key the test server requires and its header."""

from __future__ import annotations

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
