"""``QATask``: a question with gold answers, supporting passages and (when known) a gold search trace.

Tasks are stored as FlashRAG-style JSONL: ``{"id", "question", "golden_answers", "metadata"}``;
turngym's extra fields (``supporting_ids``, ``gold_trace``, ``kind``, ``hops``) live in
``metadata``, so the files stay readable by FlashRAG and other tools.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turngym.envs.search.corpus import atomic_write


@dataclass
class QATask:
    id: str
    question: str
    answers: list[str]
    supporting_ids: list[str] = field(default_factory=list)
    gold_trace: list[str] = field(default_factory=list)  # one query per supporting passage, in order
    kind: str = ""  # "bridge", "comparison", or the source data set's type
    hops: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError(f"task {self.id!r}: the question must be a non-empty string")
        if isinstance(self.answers, str):
            self.answers = [self.answers]
        self.answers = [str(a) for a in self.answers if str(a).strip()]
        if not self.answers:
            raise ValueError(f"task {self.id!r}: at least one non-empty gold answer is needed")
        if self.gold_trace and len(self.gold_trace) != len(self.supporting_ids):
            raise ValueError(f"task {self.id!r}: gold_trace and supporting_ids must align")

    @property
    def split(self) -> str:
        """A stable 90/10 train/test split from the task id."""
        return "test" if int(hashlib.sha1(self.id.encode()).hexdigest()[:8], 16) % 10 == 0 else "train"

    def reference(self) -> dict[str, Any]:
        """What ``info["reference"]`` carries (privileged: never shown to the agent)."""
        return {
            "answer": self.answers[0],
            "answers": list(self.answers),
            "supporting_ids": list(self.supporting_ids),
            "gold_trace": list(self.gold_trace),
            "question": self.question,
            "kind": self.kind,
            "hops": self.hops,
            # what each hop reveals, the answer last (synthetic questions; absent from loaded data sets)
            **(
                {"hop_answers": list(self.metadata["hop_answers"])}
                if self.metadata.get("hop_answers")
                else {}
            ),
        }

    def to_record(self) -> dict[str, Any]:
        meta = dict(self.metadata)
        meta.update(
            supporting_ids=self.supporting_ids, gold_trace=self.gold_trace, kind=self.kind, hops=self.hops
        )
        return {"id": self.id, "question": self.question, "golden_answers": self.answers, "metadata": meta}

    @classmethod
    def from_record(cls, rec: dict[str, Any], default_id: str = "") -> QATask:
        """A FlashRAG record (turngym's extra fields in ``metadata`` are optional)."""
        meta = dict(rec.get("metadata") or {})
        answers = rec.get("golden_answers", rec.get("answers", rec.get("answer")))
        if answers is None:
            raise ValueError(f"record {rec.get('id', default_id)!r} has no 'golden_answers'")
        return cls(
            id=str(rec["id"]) if rec.get("id") not in (None, "") else default_id,
            question=rec.get("question", ""),
            answers=list(answers) if not isinstance(answers, str) else [answers],
            # columnar readers (parquet, ``datasets``) fill a key another row has with None
            supporting_ids=[str(x) for x in meta.pop("supporting_ids", None) or []],
            gold_trace=[str(x) for x in meta.pop("gold_trace", None) or []],
            kind=str(meta.pop("kind", None) or ""),
            hops=int(meta.pop("hops", 0) or 0),
            metadata=meta,
        )


def write_tasks(tasks: Iterable[QATask], path: str | os.PathLike[str]) -> Path:
    """Write tasks as FlashRAG JSONL, atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as fh:
        for t in tasks:
            fh.write(json.dumps(t.to_record(), ensure_ascii=False) + "\n")
    return path
