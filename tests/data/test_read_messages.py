"""``read_rows``' messages for the mistakes a newcomer makes first say what to do."""

from __future__ import annotations

import pytest

from mlxpa.data import InputError, read_rows


def test_json_array_file_is_recognised(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text('[{"prompt": "a"},\n {"prompt": "b"}]\n')
    with pytest.raises(InputError, match=r"JSON array .*jq -c '\.\[\]'"):
        list(read_rows(str(path)))


def test_misspelt_prompt_field_is_named(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"promt": "hi"}\n')
    rows = list(read_rows(str(path)))
    assert rows[0].error.endswith('missing field "prompt" (or "messages") (is "promt" a typo?)')


def test_csv_without_header_says_how_to_fix(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text("hello there\nsecond\n")
    with pytest.raises(InputError, match="add a header line .* or pass --prompt-column"):
        list(read_rows(str(path)))
