"""``cache_salt`` in ``mlxpa run`` and ``mlxpa plan`` files: rows hit only the blocks of rows of
their own salt (the ``cached_tokens`` column; ``plan``'s prediction agrees), the text is the
same as with the prefix cache off; a bad salt stops the run before any model work naming the
file, line and field, or (``--skip-invalid``) is that row's error row alone."""

from __future__ import annotations

import json

from tests.cli.helpers import cli, write_jsonl

DOC = "Report of the harbour master on the spring tides and the moorings. " * 2
SALTS = ["red", "blue", "red", None, "blue", None, "green"]


def _rows():
    rows = []
    for i, salt in enumerate(SALTS):
        row = {"id": f"r{i}", "prompt": DOC, "max_tokens": 3}
        if salt is not None:
            row["cache_salt"] = salt
        rows.append(row)
    return rows


def _records(path):
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_rows_hit_only_their_own_salt(tmp_path, tiny):
    src = write_jsonl(tmp_path / "in.jsonl", _rows())
    on, off = tmp_path / "on.jsonl", tmp_path / "off.jsonl"
    common = ("--model", tiny, "-q", "--kv-memory", "0.001", "--block-size", "16")
    assert cli("run", src, "-o", on, *common).exit_code == 0
    assert cli("run", src, "-o", off, *common, "--no-enable-prefix-caching").exit_code == 0
    got, want = _records(on), _records(off)
    prompt = got["r0"]["prompt_tokens"]
    hit = (prompt - 1) // 16 * 16
    by_salt: dict = {}
    for i, salt in enumerate(SALTS):
        by_salt.setdefault(salt, []).append(got[f"r{i}"]["cached_tokens"])
        assert got[f"r{i}"]["text"] == want[f"r{i}"]["text"] and "cache_salt" not in got[f"r{i}"]
    # each salt's first row computes the document, its second hits it; nothing crosses
    assert by_salt == {"red": [0, hit], "blue": [0, hit], None: [0, hit], "green": [0]}
    r = cli("plan", src, "--model", tiny, "--json", "--block-size", "16")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["computed_prompt_tokens"] == 7 * prompt - 3 * hit
    assert [p["num_rows"] for p in plan["shared_prefixes"]] == [2, 2, 2]


def test_a_bad_salt_names_file_line_and_field(tmp_path, tiny):
    rows = _rows()[:3] + [{"id": "bad", "prompt": "x", "cache_salt": ""},
                          {"id": "worse", "prompt": "y", "cache_salt": {"a": 1}}]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    r = cli("run", src, "-o", out, "--model", tiny, "-q", "--kv-memory", "0.001")
    assert r.exit_code == 2 and not out.exists()
    rule = 'field "cache_salt" must be a non-empty string of at most 256 characters, got'
    assert f'{src} line 4: {rule} ""' in r.stderr
    assert f'{src} line 5: {rule} {{"a": 1}}' in r.stderr
    r = cli("run", src, "-o", out, "--model", tiny, "-q", "--kv-memory", "0.001",
            "--skip-invalid")
    assert r.exit_code == 0, r.output
    got = _records(out)
    assert got["bad"]["error"] == f'{src} line 4: {rule} ""'
    assert got["worse"]["error"].startswith(f"{src} line 5: {rule}")
    assert [got[f"r{i}"].get("error") for i in range(3)] == [None] * 3
    red = sorted(got[f"r{i}"]["cached_tokens"] for i in (0, 2))
    assert red[0] == 0 < red[1] and got["r1"]["cached_tokens"] == 0
