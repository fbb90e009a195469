"""The browser envs' shared package: what every browser env needs, whatever its pages.

Modules: :mod:`.env` (``BrowserEnv``: page lease, tool calls into the page, crash/fault masking,
page-error notes), :mod:`.dom` (the pruned DOM snapshot with stable element ids), :mod:`.page`
(snapshot, screenshot, elements by id), :mod:`.element_tools` (BrowserGym's tools by element id),
:mod:`.pixels` (screenshot observations and pixel coordinates), :mod:`.sites` (multi-page local
sites: ``SiteBrowserEnv``, the local server, storage, and the site registry).

The browser families are leaves on top of it: ``web-miniwob`` (:mod:`turngym.envs.web`),
``gui-miniwob`` (:mod:`turngym.envs.gui`, MiniWoB++ through pixels), ``web-arena-lite``
(:mod:`turngym.envs.webarena`) and ``web-shop`` (:mod:`turngym.envs.webshop`).
"""
