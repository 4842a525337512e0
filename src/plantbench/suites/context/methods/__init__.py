"""Context attribution methods: one module each, registered in :mod:`.registry`."""
