"""Attribution methods: one module per method, each registering one scoring function
(see :mod:`plantbench.methods.registry` for the interface and for plug-ins)."""

from .registry import available, describe, get, load_plugins, register

__all__ = ["available", "describe", "get", "load_plugins", "register"]
