"""Attribution methods: one module per method, each registering one scoring function
(see :mod:`plantbench.attribution.methods.registry` for the interface and for plug-ins)."""

from plantbench.attribution.methods.registry import available, describe, get, load_plugins, register

__all__ = ["available", "describe", "get", "load_plugins", "register"]
