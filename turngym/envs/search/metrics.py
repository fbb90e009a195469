"""Answer scoring as in SQuAD: normalisation, exact match and token F1, best over gold alternatives.

``normalize_answer`` follows the official SQuAD v1.1 evaluation script (lowercase, drop
punctuation, drop the articles a/an/the, collapse whitespace), which Search-R1, FlashRAG and
IGPO all use for EM and F1.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str) -> float:
    """Token-level F1 between the normalised strings (SQuAD v2: two empty strings score 1)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def best_exact_match(prediction: str, golds: Iterable[str]) -> float:
    """EM against the best of several gold alternatives (0.0 when there are none)."""
    return max((exact_match(prediction, g) for g in golds), default=0.0)


def best_f1(prediction: str, golds: Iterable[str]) -> float:
    """F1 against the best of several gold alternatives (0.0 when there are none)."""
    return max((f1_score(prediction, g) for g in golds), default=0.0)


def contains_answer(text: str, golds: Iterable[str]) -> bool:
    """Whether some normalised gold alternative occurs in the normalised ``text`` as whole tokens."""
    haystack = f" {normalize_answer(text)} "
    return any(f" {g} " in haystack for g in map(normalize_answer, golds) if g)
