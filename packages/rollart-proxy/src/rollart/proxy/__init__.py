"""rollart.proxy: The LLMProxy gateway, inference workers with a command-driven step loop, engine backends, routing, shrink/expand with request migration."""

__version__ = "0.1.0"
