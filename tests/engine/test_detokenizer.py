"""``IncrementalDetokenizer``: a stop string split across three tokens is found when its last
token arrives, the text ends before it (or after it with include_stop), and ``min_tokens`` keeps
earlier text out of the search; the oracle is ``str.find`` on the decoded text."""

from __future__ import annotations

from mlxpa.engine.detokenizer import IncrementalDetokenizer
from tests.tiny_models import byte_tokenizer


def feed(tok, text: str, **kw) -> tuple[IncrementalDetokenizer, list[bool]]:
    d = IncrementalDetokenizer(tok, **kw)
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one character per token
    return d, [d.add_token(t) for t in ids]


def test_stop_string_across_three_tokens():
    tok = byte_tokenizer()
    text = "abc END tail"
    d, hits = feed(tok, text, stop=("END", "zz"))
    # 'E', 'N', 'D' are tokens 4, 5, 6: only the last one completes the stop string.
    assert hits == [False] * 6 + [True] * (len(text) - 6)
    assert (d.stop_index, d.stop_string) == (text.find("END"), "END")
    assert d.finalize() == "abc "
    d, _ = feed(tok, text, stop=("END",), include_stop=True)
    assert d.finalize() == "abc END"


def test_earliest_stop_wins_and_min_tokens_hides_earlier_text():
    tok = byte_tokenizer()
    d, _ = feed(tok, "xxBBxxAA", stop=("AA", "BB"))
    assert d.finalize() == "xx"
    # With min_tokens=5 the "BB" at tokens 2-3 is never searched; "AA" ends the text.
    d, hits = feed(tok, "xxBBxxAA", stop=("AA", "BB"), min_tokens=5)
    assert hits.index(True) == 7 and d.finalize() == "xxBBxx"
    d, hits = feed(tok, "no stop here", stop=("END",))
    assert not any(hits) and d.finalize() == "no stop here"
