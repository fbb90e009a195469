"""``web-shop``: WebShop's task and reward on a local shop web app, through the web-miniwob browser tools.

Modules: :mod:`.vocab` (product types, attributes, options), :mod:`.catalog` (seeded 12k-product
SQLite catalog with BM25 search), :mod:`.goals` (instructions sampled from a target product),
:mod:`.reward` (WebShop's reward), :mod:`.app` (the Starlette shop), :mod:`.env` (``WebShopEnv``),
:mod:`.expert` (scripted expert), :mod:`.commands` (CLI).
"""
