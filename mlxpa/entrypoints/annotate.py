""":meth:`LLM.annotate`: typed questions about documents. Each document is read as the row of
``mlxpa run`` it is (a text, a conversation, a dict), asked the call's question set (the
request schema, then the input processor's question group), runs through the streaming core
the other calls use, and gets the file run's answers
(:func:`mlxpa.annotation.answers.answers_of`) as an
:class:`~mlxpa.entrypoints.outputs.AnnotationOutput`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mlxpa.annotation.answers import answers_of
from mlxpa.annotation.calibration import Calibration
from mlxpa.annotation.calibration_file import load_calibration
from mlxpa.annotation.questions import QuestionSet, load_questions, parse_question_set
from mlxpa.core.prefix_order import PREFIX_WINDOW
from mlxpa.engine.stream import windows
from mlxpa.entrypoints.outputs import AnnotationOutput, Decode, QuestionAnswer
from mlxpa.entrypoints.prompts import CallIds, PromptRequest, dict_request
from mlxpa.inputs.schema import ROW
from mlxpa.sampling_params import SamplingParams

if TYPE_CHECKING:
    from mlxpa.engine.stream import Finished


def annotate(llm: Any, documents: Any, questions: Any, calibration: Any, permute: bool,
             use_tqdm: bool) -> list[AnnotationOutput]:
    """:meth:`LLM.annotate` (its docstring): every document checked first, then run."""
    qs = question_set(questions)
    cal = calibration_of(calibration, qs)
    if not isinstance(permute, bool):
        raise TypeError(f"permute_labels must be True or False, got {type(permute).__name__}")
    spec = ROW._replace(questions=qs)
    processor, ids, items = llm._processor(), CallIds("documents"), []
    for i, doc in enumerate(document_list(documents)):
        item = dict_request(i, _row(i, doc), SamplingParams(), processor, "documents", spec,
                            permute)
        duplicate = ids.claim(i, item.request_id, item.request_id != str(i))
        if item.error is None and duplicate is not None:
            item = item._replace(error=duplicate)
        if item.error is None and item.questions is None:
            item = item._replace(error=f'documents[{i}]: no questions (give questions=..., '
                                       'or a "questions" field)')
        if item.error is not None:
            raise ValueError(item.error)
        items.append(item)
    llm._fit([item.request for item in items])

    def convert(result: Finished[PromptRequest], decode: Decode,
                place: str) -> AnnotationOutput:
        return annotation_output(result, place, cal, permute)

    results: list[Any] = [None] * len(items)
    for index, out in llm._stream(windows(items, PREFIX_WINDOW), False, use_tqdm, len(items),
                                  "documents", convert):
        results[index] = out
    return results


def question_set(questions: Any) -> QuestionSet | None:
    """``questions`` as a :class:`QuestionSet` (a path to its JSON file, its JSON value, or
    one already), or None.

    Raises:
        TypeError: Another type.
        ValueError: A file or value that is not a question set (naming the field).
    """
    if questions is None or isinstance(questions, QuestionSet):
        return questions
    if isinstance(questions, (str, os.PathLike)):
        return load_questions(os.fspath(questions))
    if isinstance(questions, (list, Mapping)):
        problems: list[str] = []
        qs = parse_question_set(dict(questions) if isinstance(questions, Mapping)
                                else questions, "questions", problems)
        if qs is None:
            raise ValueError("; ".join(problems))
        return qs
    raise TypeError("questions must be a path, a question set's JSON value (a list or a "
                    f"dict) or a QuestionSet, got {type(questions).__name__}")


def calibration_of(calibration: Any, questions: QuestionSet | None) -> Calibration | None:
    """``calibration`` as a :class:`Calibration` (a path to a calibration file, or one
    already), checked against ``questions``; or None.

    Raises:
        TypeError: Another type.
        ValueError: As :func:`~mlxpa.annotation.calibration_file.load_calibration`.
    """
    if calibration is None or isinstance(calibration, Calibration):
        return calibration
    if isinstance(calibration, (str, os.PathLike)):
        return load_calibration(calibration, questions)
    raise TypeError("calibration must be a calibration file's path or a Calibration, got "
                    f"{type(calibration).__name__}")


def document_list(documents: Any) -> list[Any]:
    """``documents`` as a list: one text, conversation or dict is one document."""
    if isinstance(documents, (str, dict)) or _conversation(documents):
        return [documents]
    if isinstance(documents, (list, tuple)):
        return list(documents)
    raise TypeError("documents must be a text, a conversation, a dict (a row of mlxpa run) or "
                    f"a list of them, got {type(documents).__name__}")


def _conversation(value: Any) -> bool:
    return (isinstance(value, (list, tuple)) and bool(value)
            and all(isinstance(m, dict) and "role" in m for m in value))


def _row(index: int, doc: Any) -> dict[str, Any]:
    if isinstance(doc, str):
        return {"prompt": doc}
    if _conversation(doc):
        return {"messages": list(doc)}
    if isinstance(doc, dict):
        return doc
    raise TypeError(f"documents[{index}]: expected a text, a conversation or a dict (a row "
                    f"of mlxpa run), got {type(doc).__name__}")


def annotation_output(result: Finished[PromptRequest], place: str,
                      calibration: Calibration | None, permute: bool) -> AnnotationOutput:
    """The :class:`AnnotationOutput` of one document done by the streaming core."""
    item, outs = result.item, result.outputs
    out = outs[0] if outs else None
    ids = item.request.prompt_token_ids if item.request is not None else None
    error = item.error or (f"{place}: {out.error}" if out and out.error else None)
    answers, changed = {}, None
    if error is None and out is not None:
        try:
            answers, changed = answers_of(item.questions, out.question_scores, calibration,
                                          permute)
        except ValueError as e:
            error = f"{place}: calibration: {e}"
    return AnnotationOutput(
        request_id=item.request_id, prompt=item.prompt, prompt_token_ids=ids,
        outputs={name: QuestionAnswer(**a) for name, a in answers.items()},
        label_order_changed=changed,
        num_cached_tokens=out.num_cached_tokens if out else None, error=error)
