"""Environment families, one package each. ``catalog`` registers them (lazily, by string entry point)."""
