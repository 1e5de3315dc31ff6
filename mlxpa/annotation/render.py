"""How a question follows a document: the text (or chat messages) after which its labels are
scored.

A ``prompt`` document: ``preamble + "\\n\\n" + document + question.suffix`` (no preamble: the
document and the suffix), each label scored verbatim right after it (the tokenizer's join of
:mod:`mlxpa.structured.labels` gives a trailing space of the suffix to the label). Every
question of a row shares the text up to the end of the document, so the document's tokens are
one prefix of all of them.

A ``messages`` document: the preamble is a system message (before the row's own system
message's text, when it has one); the question is the suffix, stripped, as a user turn: added
to the last message when that is the user's (chat templates that want alternating roles),
else a new user message. The label is scored as the start of the assistant's reply (the chat
template's generation prompt before it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mlxpa.annotation.questions import Question, QuestionSet


def document_text(document: str, preamble: str | None = None) -> str:
    """The text every question of a ``prompt`` document starts with."""
    return f"{preamble}\n\n{document}" if preamble else document


def prompt_text(document: str, question: Question, preamble: str | None = None) -> str:
    """The text after which ``question``'s labels are scored, for a ``prompt`` document."""
    return document_text(document, preamble) + question.suffix


def document_messages(messages: Sequence[Mapping[str, str]],
                      preamble: str | None = None) -> list[dict[str, str]]:
    """A ``messages`` document with the preamble as its system message."""
    out = [dict(m) for m in messages]
    if not preamble:
        return out
    if out and out[0].get("role") == "system":
        out[0]["content"] = f"{preamble}\n\n{out[0]['content']}"
        return out
    return [{"role": "system", "content": preamble}, *out]


def question_messages(messages: Sequence[Mapping[str, str]], question: Question,
                      preamble: str | None = None) -> list[dict[str, str]]:
    """The conversation after which ``question``'s labels are scored (with the chat
    template's generation prompt), for a ``messages`` document."""
    out = document_messages(messages, preamble)
    if out and out[-1].get("role") == "user":
        out[-1]["content"] = out[-1]["content"] + question.suffix.rstrip()
    else:
        out.append({"role": "user", "content": question.suffix.strip()})
    return out


def example_text(document: str, answers: Mapping[str, str], questions: QuestionSet) -> str:
    """One worked example for a few-shot preamble: the document, then each question of
    ``questions`` that ``answers`` answers, its suffix followed by its label.

    Raises:
        ValueError: An answer is not one of its question's labels, or names no question.
    """
    unknown = set(answers) - set(questions.names)
    if unknown:
        raise ValueError(f"example answers name no question: {', '.join(sorted(unknown))}")
    text = document
    for q in questions.questions:
        if q.name in answers:
            if answers[q.name] not in q.labels:
                raise ValueError(f"example answer {answers[q.name]!r} is not a label of "
                                 f"question {q.name!r}")
            text += q.suffix + answers[q.name]
    return text


def few_shot_preamble(examples: Sequence[tuple[str, Mapping[str, str]]], questions: QuestionSet,
                      instructions: str | None = None) -> str:
    """A preamble of worked examples (:func:`example_text`), separated by blank lines,
    after ``instructions`` when given: the documents after it then read as one more
    example."""
    parts = ([instructions] if instructions else []) + [
        example_text(doc, answers, questions) for doc, answers in examples]
    return "\n\n".join(parts)
