"""search-qa: multi-hop question answering with a search tool over a local passage corpus.

Parts: ``corpus`` (JSONL passages), ``retriever`` (bm25s, cached on disk), ``server`` (a
``/retrieve`` FastAPI server and its httpx client), ``world`` + ``questions`` (a seeded synthetic
world with bridge and comparison questions), ``loaders`` (Search-R1 parquet, FlashRAG JSONL,
HotpotQA JSON), ``metrics`` (SQuAD EM/F1) and ``env`` (``SearchQAEnv``). Import the submodules
directly; this package imports nothing heavy.
"""
