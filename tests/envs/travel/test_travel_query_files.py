"""TravelPlanner query files: JSONL, a JSON list or one JSON object, with the dataset's Python literals."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.envs.travel.models import Query, load_queries

PUBLISHED = {  # one record as TravelPlanner's validation split ships it (Python-literal strings)
    "org": "Sarasota",
    "dest": "Chicago",
    "days": 3,
    "visiting_city_number": 1,
    "date": "['2022-03-22', '2022-03-23', '2022-03-24']",
    "people_number": 2,
    "local_constraint": "{'house rule': 'parties', 'cuisine': ['Chinese'], 'room type': None, 'transportation': None}",
    "budget": 1900,
    "query": "Please plan a trip from Sarasota to Chicago ...",
    "level": "medium",
    "reference_information": "[{'Description': 'ignored'}]",
}


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "name, render",
    [
        ("one.json", lambda rs: json.dumps(rs[0], indent=2)),  # a file holding one query object
        ("one-line.json", lambda rs: json.dumps(rs[0])),
        ("list.json", lambda rs: json.dumps(rs, indent=2)),
        ("list-line.json", lambda rs: json.dumps(rs)),
        ("q.jsonl", lambda rs: "\n".join(json.dumps(r) for r in rs) + "\n"),
    ],
)
def test_every_layout_of_the_published_record_loads(tmp_path, name, render):
    records = [PUBLISHED] if name.startswith("one") else [PUBLISHED, dict(PUBLISHED, level="hard", days=5)]
    qs = load_queries(_write(tmp_path, name, render(records)))
    assert len(qs) == len(records)
    q = qs[0]
    assert q.date == ["2022-03-22", "2022-03-23", "2022-03-24"]
    assert q.local_constraint.house_rule == "parties" and q.local_constraint.cuisine == ["Chinese"]
    assert q.local_constraint.active() == ["house rule", "cuisine"]


def test_the_former_name_still_loads_json(tmp_path):
    from turngym.envs.travel.models import load_queries_jsonl

    assert (
        load_queries_jsonl(_write(tmp_path, "q.json", json.dumps(PUBLISHED, indent=1)))[0].org == "Sarasota"
    )


_constraint = st.fixed_dictionaries(
    {
        "house rule": st.sampled_from([None, "parties", "smoking", "pets"]),
        "cuisine": st.one_of(
            st.none(), st.lists(st.sampled_from(["Chinese", "Indian", "French"]), min_size=1)
        ),
        "room type": st.sampled_from([None, "private room", "entire room"]),
        "transportation": st.sampled_from([None, "no flight", "no self-driving"]),
    }
)
_record = st.builds(
    lambda org, dest, days, people, budget, lc, literal, level: {
        "org": org,
        "dest": dest,
        "days": days,
        "visiting_city_number": {3: 1, 5: 2, 7: 3}[days],
        "date": str([f"2022-03-{d:02d}" for d in range(1, days + 1)])
        if literal
        else [f"2022-03-{d:02d}" for d in range(1, days + 1)],
        "people_number": people,
        "local_constraint": str(lc) if literal else lc,  # str(dict) = the dataset's Python literal
        "budget": budget,
        "query": f"{org} -> {dest}",
        "level": level,
    },
    st.text("abcdefgh XYZ", min_size=1, max_size=12),
    st.text("abcdefgh XYZ", min_size=1, max_size=12),
    st.sampled_from([3, 5, 7]),
    st.integers(1, 8),
    st.integers(0, 20_000),
    _constraint,
    st.booleans(),
    st.sampled_from(["easy", "medium", "hard"]),
)


@settings(max_examples=40)
@given(st.lists(_record, min_size=1, max_size=5))
def test_jsonl_list_and_object_files_agree(tmp_path_factory, records):
    tmp = tmp_path_factory.mktemp("q")
    from_jsonl = load_queries(_write(tmp, "q.jsonl", "\n".join(json.dumps(r) for r in records)))
    from_list = load_queries(_write(tmp, "q.json", json.dumps(records, indent=1)))
    assert from_jsonl == from_list and len(from_list) == len(records)
    assert load_queries(_write(tmp, "one.json", json.dumps(records[0], indent=3))) == from_list[:1]
    for q in from_list:  # the TravelPlanner dict round-trips
        assert Query.model_validate(q.to_travelplanner()) == q


@pytest.mark.parametrize(
    "name, text, match",
    [
        # a Python dict where JSON is expected: the file and the line are named
        (
            "py.jsonl",
            "{'org': 'A'}\n",
            r"py.jsonl:1: not valid JSON \(Expecting property name .* at column 2\)",
        ),
        ("bad.jsonl", json.dumps(PUBLISHED) + "\n\n{broken\n", r"bad.jsonl:3: not valid JSON \(.*column 2\)"),
        (
            "comma.json",
            json.dumps(PUBLISHED, indent=2)[:-2] + ",\n}",
            r"comma.json:13: not valid JSON \(.* at column",
        ),
        (
            "list.json",
            json.dumps([PUBLISHED, 7]),
            r"list.json: record 2: a query must be a JSON object, got int",
        ),
        (
            "budget.json",
            json.dumps([PUBLISHED, dict(PUBLISHED, budget=-5)]),
            r"budget.json: record 2: not a TravelPlanner query: budget: Input should be greater than or equal to 0",
        ),
        (
            "literal.jsonl",
            json.dumps(dict(PUBLISHED, local_constraint="{'house rule': None,")) + "\n",
            r"literal.jsonl:1: not a TravelPlanner query: local_constraint: .*not a Python dict literal: \"\{'house rule'",
        ),
        (
            "missing.json",
            json.dumps({k: v for k, v in PUBLISHED.items() if k != "org"}),
            r"missing.json:1: not a TravelPlanner query: org: Field required",
        ),
        ("empty.json", "\n  \n", r"empty.json: no queries in the file"),
        (
            "text.json",
            "\norg,dest\n",
            r"text.json:2: expected a JSON object, a JSON list of objects or JSONL",
        ),
    ],
)
def test_malformed_files_name_the_file_the_place_and_the_problem(tmp_path, name, text, match):
    with pytest.raises(ValueError, match=match):
        load_queries(_write(tmp_path, name, text))


def _write_csv(tmp_path, name, records):
    import csv

    path = tmp_path / name
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    return path


def test_csv_split_as_the_hugging_face_copy_ships_it(tmp_path):
    """A header row, every cell a string: the literals, the numbers and a multi-line query text."""
    records = [PUBLISHED, dict(PUBLISHED, query="Line one,\nline two", level="hard", budget=2500.5)]
    qs = load_queries(_write_csv(tmp_path, "validation.csv", records))
    assert [q.level for q in qs] == ["medium", "hard"] and qs[1].budget == 2500.5 and qs[0].days == 3
    assert qs[0] == load_queries(_write(tmp_path, "q.json", json.dumps(PUBLISHED)))[0]
    assert qs[1].query == "Line one,\nline two"
    bad = _write_csv(tmp_path, "bad.csv", [PUBLISHED, dict(PUBLISHED, query="x\ny", days="three")])
    with pytest.raises(
        ValueError, match=r"bad\.csv:4: not a TravelPlanner query: days: Input should be a valid integer"
    ):
        load_queries(bad)
    (tmp_path / "header.csv").write_text("org,dest\n")
    with pytest.raises(
        ValueError, match=r"header\.csv: no queries in the file \(a header row but no query rows\)"
    ):
        load_queries(tmp_path / "header.csv")
    (tmp_path / "wide.csv").write_text("org,dest\nA,B,C\n")
    with pytest.raises(ValueError, match=r"wide\.csv:2: the row has more cells than the header"):
        load_queries(tmp_path / "wide.csv")


def test_literal_fields_also_read_as_json_and_oversized_literals_are_refused(tmp_path):
    as_json = dict(
        PUBLISHED,
        local_constraint=json.dumps(
            {"house rule": None, "cuisine": ["Indian"], "room type": None, "transportation": "no flight"}
        ),
        date=json.dumps(["2022-03-22", "2022-03-23", "2022-03-24"]),
    )
    [q] = load_queries(_write(tmp_path, "q.jsonl", json.dumps(as_json) + "\n"))
    assert q.local_constraint.active() == ["cuisine", "transportation"] and q.date[2] == "2022-03-24"
    huge = dict(PUBLISHED, local_constraint="{'cuisine': [" + "'x', " * 30_000 + "]}")
    with pytest.raises(
        ValueError, match=r"q2\.jsonl:1: not a TravelPlanner query: local_constraint: .*the limit is 100000"
    ):
        load_queries(_write(tmp_path, "q2.jsonl", json.dumps(huge) + "\n"))
