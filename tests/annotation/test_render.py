"""The text (or messages) a question's labels are scored after, and few-shot preambles."""

from __future__ import annotations

import pytest

from mlxpa.annotation.questions import Question, QuestionSet
from mlxpa.annotation.render import (
    document_messages,
    document_text,
    example_text,
    few_shot_preamble,
    prompt_text,
    question_messages,
)

TOPIC = Question("topic", "choice", ("a", "b"), "Which?")
SPAM = Question("spam", "yes_no", ("yes", "no"), "Spam?")


def test_prompt_documents():
    assert prompt_text("Doc.", TOPIC) == "Doc.\n\nQuestion: Which?\nAnswer: "
    assert prompt_text("Doc.", SPAM, "Intro") == (
        "Intro\n\nDoc.\n\nQuestion: Spam?\nAnswer: ")
    # every question starts with the document's text
    for q in (TOPIC, SPAM):
        assert prompt_text("Doc.", q, "Intro").startswith(document_text("Doc.", "Intro"))


def test_messages_documents():
    user = [{"role": "user", "content": "Doc."}]
    assert question_messages(user, TOPIC) == [
        {"role": "user", "content": "Doc.\n\nQuestion: Which?\nAnswer:"}]
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Doc."}]
    assert question_messages(chat, SPAM, "Be brief.") == [
        {"role": "system", "content": "Be brief."}, *chat,
        {"role": "user", "content": "Question: Spam?\nAnswer:"}]
    system = [{"role": "system", "content": "Own."}, *user]
    assert document_messages(system, "Pre.")[0] == {"role": "system", "content": "Pre.\n\nOwn."}
    assert user == [{"role": "user", "content": "Doc."}]  # the row's messages are not changed


def test_few_shot_preamble():
    qs = QuestionSet((TOPIC, SPAM))
    assert example_text("D1", {"topic": "b", "spam": "no"}, qs) == (
        "D1" + TOPIC.suffix + "b" + SPAM.suffix + "no")
    pre = few_shot_preamble([("D1", {"topic": "a"}), ("D2", {"spam": "yes"})], qs, "Tag it.")
    assert pre == "Tag it.\n\nD1" + TOPIC.suffix + "a\n\nD2" + SPAM.suffix + "yes"
    with pytest.raises(ValueError, match="not a label"):
        example_text("D", {"topic": "c"}, qs)
    with pytest.raises(ValueError, match="name no question: mood"):
        example_text("D", {"mood": "c"}, qs)
