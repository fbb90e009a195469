"""The ``swe-docker`` family: real bugs in real Python packages, fixed inside Docker sandboxes.

Modules: ``env`` (the environment and its tools), ``tasks`` (SWE-bench format, loaders, synthesis),
``mutations`` (bug injection), ``packages`` (the source packages and their images), ``repo`` (repository
set-up, patches and grading in a sandbox), ``editor`` (the file editor's text operations),
``pytest_report`` (the pytest plugin used inside containers), ``commands`` (``turngym swe ...``).
"""
