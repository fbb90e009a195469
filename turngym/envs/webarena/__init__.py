"""``web-arena-lite``: WebArena-style tasks on local stateful sites (a forum and an issue tracker).

A leaf of :mod:`turngym.envs.browser` (``SiteBrowserEnv``, the local server and storage live in
:mod:`turngym.envs.browser.sites`). Modules: :mod:`.sites` (forum and issue tracker), :mod:`.tasks`
(WebArena's JSON task format), :mod:`.taskgen` (generated tasks), :mod:`.evaluators` (string / URL /
program checks), :mod:`.env` (``WebArenaEnv``), :mod:`.expert` (scripted experts), :mod:`.commands`.
"""
