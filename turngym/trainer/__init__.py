"""The trainer: turn-level credit assignment, losses, and the RL loop.

Importing this package stays light; torch and transformers load inside the modules that need them
(``loss``, ``loop``, ``credit.info_gain``, ``weight_sync``).
"""
