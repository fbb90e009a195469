"""``web-arena-lite``: WebArena-style tasks on local stateful sites, and the multi-page browser env base.

Modules: :mod:`.server` (a Starlette/ASGI app on a free loopback port), :mod:`.storage` (cached
pristine SQLite files, restorable working copies), :mod:`.sites` (forum and issue tracker),
:mod:`.tasks` (WebArena's JSON task format), :mod:`.taskgen` (generated tasks), :mod:`.evaluators`
(string / URL / program checks), :mod:`.browser_env` (``SiteBrowserEnv``: web-miniwob tools plus
navigation and tabs), :mod:`.env` (``WebArenaEnv``), :mod:`.expert` (scripted experts).
"""
