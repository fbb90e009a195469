"""Sandboxes that environments run in: Docker containers (``docker``, ``pool``, ``images``) and browsers.

Nothing heavy is imported here: each module loads its own dependencies lazily.
"""
