"""Small files in the exact published formats (Search-R1 parquet, HotpotQA JSON), shared by the tests."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

SEARCH_R1_PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. ... For example, <answer> Beijing </answer>. Question: "
)


def write_search_r1(path, rows):
    """A parquet file with the columns Search-R1's data_process scripts write."""
    table = pa.table(
        {
            "id": [r["id"] for r in rows],
            "question": [r["question"] for r in rows],
            "golden_answers": [r["answers"] for r in rows],
            "data_source": ["nq"] * len(rows),
            "prompt": [[{"role": "user", "content": SEARCH_R1_PREFIX + r["question"] + "\n"}] for r in rows],
            "ability": ["fact-reasoning"] * len(rows),
            "reward_model": [{"style": "rule", "ground_truth": {"target": r["answers"]}} for r in rows],
            "extra_info": [{"split": "train", "index": i} for i in range(len(rows))],
        }
    )
    pq.write_table(table, path)


HOTPOT = [
    {
        "_id": "5a8b57f25542995d1e6f1371",
        "answer": "yes",
        "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
        "supporting_facts": [["Scott Derrickson", 0], ["Ed Wood", 0]],
        "context": [
            [
                "Ed Wood (film)",
                [
                    "Ed Wood is a 1994 American biographical period comedy-drama film.",
                    " It stars Johnny Depp.",
                ],
            ],
            [
                "Scott Derrickson",
                ["Scott Derrickson (born July 16, 1966) is an American director.", " He lives in LA."],
            ],
            ["Ed Wood", ["Edward Davis Wood Jr. was an American filmmaker."]],
        ],
        "type": "comparison",
        "level": "hard",
    },
    {
        "_id": "5a8c7595554299585d9e36b6",
        "answer": "Chief of Protocol",
        "question": "What government position was held by the woman who portrayed Corliss Archer?",
        "supporting_facts": [["Kiss and Tell (1945 film)", 0], ["Shirley Temple", 0], ["Shirley Temple", 1]],
        "context": [
            [
                "Kiss and Tell (1945 film)",
                ["Kiss and Tell is a 1945 comedy starring Shirley Temple as Corliss Archer."],
            ],
            [
                "Shirley Temple",
                ["Shirley Temple Black was an actress.", " She was Chief of Protocol of the United States."],
            ],
            ["Ed Wood", ["Edward Davis Wood Jr. was an American filmmaker."]],
        ],
        "type": "bridge",
        "level": "medium",
    },
]
