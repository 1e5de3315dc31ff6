"""The requests ``mlxpa bench serve`` sends: the offline bench's workloads as OpenAI requests.

``shared-prefix`` and ``random`` are :mod:`mlxpa.bench.workloads`' token-id prompts decoded
to text (as vLLM's random dataset sends its ids), then sent as chat messages (a shared-prefix
prompt: its shared part as the system message, its own question as the user message) or as
a completions prompt. Their ids are drawn so that the text encodes back to them
(:mod:`~mlxpa.bench.token_draw`); each request's prompt, as the model's tokenizer and chat
template read it, is checked to hold them (``params["not_round_trip"]`` counts those that
do not). ``file`` sends every valid row of an input ``mlxpa run`` reads (its
``messages`` to the chat endpoint, its ``prompt`` or ``prompt_token_ids`` to the
completions endpoint; an OpenAI Batch line to its ``url``), with the row's sampling fields.
The text workloads (:mod:`~mlxpa.bench.text_workloads`, ``copy-heavy`` among them) send their
few-shot prompts as a completions prompt or as one user message, with their own
``max_tokens``, ``stop`` strings and ``ignore_eos: false``: their rows end by themselves.
Every request is greedy unless its row says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from mlxpa.bench.text_workloads import TEXT_NAMES, text_params, text_prompts
from mlxpa.bench.workloads import random_workload, shared_prefix_workload
from mlxpa.data.rows import Row
from mlxpa.inputs.schema import SAMPLING_FIELDS

ENDPOINTS = ("chat", "completions")
SERVE_WORKLOADS = ("shared-prefix", "random", "file", *TEXT_NAMES)


@dataclass(frozen=True)
class ServeRequest:
    """One request of a serving workload.

    Attributes:
        index: Position in the workload (0-based).
        endpoint: ``chat`` (``/v1/chat/completions``) or ``completions`` (``/v1/completions``).
        row: The request's body fields but ``model`` and ``stream``: ``messages`` or
            ``prompt``, ``max_tokens``, ``temperature`` and any sampling field of the row; the
            same dict is a row of ``mlxpa run`` (the offline system runs it as one).
        prompt_len: Prompt tokens as the model's tokenizer and chat template count them.
    """

    index: int
    endpoint: str
    row: dict = field(hash=False)
    prompt_len: int

    @property
    def max_tokens(self) -> int:
        return self.row["max_tokens"]


class ServeWorkload(NamedTuple):
    """A workload's name, its requests and its parameters (for the report)."""

    name: str
    requests: list[ServeRequest]
    params: dict

    @property
    def num_prompt_tokens(self) -> int:
        return sum(r.prompt_len for r in self.requests)

    @property
    def num_output_tokens(self) -> int:
        return sum(r.max_tokens for r in self.requests)


def _text(tokenizer, ids: list[int]) -> str:
    """The text of token ids, without a leading BOS (the server's template adds its own)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return tokenizer.decode(ids[1:] if ids and bos is not None and ids[0] == bos else ids)


def _prompt_ids(fields: dict, tokenizer) -> list[int]:
    """The prompt ids of ``fields`` (``messages`` or ``prompt``) as ``mlxpa run`` reads a row's
    (the input processor's tokenization, the chat template applied).

    Raises:
        ValueError: A chat request to a model without a chat template, or one its template
            rejects.
    """
    from mlxpa.inputs import ChatPrompt, InputProcessor

    prompt = fields.get("prompt")
    if fields.get("messages") is not None:
        prompt = ChatPrompt(fields["messages"], fields.get("chat_template_kwargs"))
    return InputProcessor(tokenizer).prompt_token_ids(prompt)


def _request(index: int, endpoint: str, fields: dict, tokenizer) -> ServeRequest:
    """A request of ``fields``, its prompt counted as ``mlxpa run`` counts a row's.

    Raises:
        ValueError: As :func:`_prompt_ids`.
    """
    return ServeRequest(index, endpoint, fields, len(_prompt_ids(fields, tokenizer)))


def _holds(ids: list[int], piece: list[int]) -> bool:
    """``piece`` is a run of ``ids`` (an empty piece always is)."""
    n = len(piece)
    return n == 0 or any(ids[i:i + n] == piece for i in range(len(ids) - n + 1))


def synthetic_requests(name: str, tokenizer, endpoint: str = "chat", *, num_prompts: int = 64,
                       input_len: int = 320, range_ratio: float = 0.6, output_len: int = 32,
                       num_groups: int = 1, prompts_per_group: int = 48,
                       system_prompt_len: int = 512, question_len: int = 32,
                       seed: int = 0) -> ServeWorkload:
    """``shared-prefix`` or ``random`` (parameters as :func:`~mlxpa.bench.workloads.make_workload`
    takes them) as greedy requests to ``endpoint``, ``output_len`` tokens each.

    Raises:
        ValueError: An unknown name or endpoint, sizes out of range, or ``chat`` to a model
            without a chat template.
    """
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    if name == "shared-prefix":
        wl = shared_prefix_workload(tokenizer, num_groups, prompts_per_group, system_prompt_len,
                                    question_len, output_len, seed)
        split = system_prompt_len
    elif name == "random":
        wl = random_workload(tokenizer, num_prompts, input_len, output_len, range_ratio, seed)
        split = 0
    else:
        raise ValueError(f"workload must be shared-prefix or random, got {name!r}")
    requests, mismatched = [], 0
    bos = getattr(tokenizer, "bos_token_id", None)
    for i, (ids, n) in enumerate(zip(wl.prompts, wl.output_lens)):
        shared, own = _text(tokenizer, ids[:split]), _text(tokenizer, ids[split:])
        if endpoint == "completions":
            fields = {"prompt": shared + own}
        else:
            fields = {"messages": ([{"role": "system", "content": shared}] if split else [])
                      + [{"role": "user", "content": own}]}
        fields.update(max_tokens=n, temperature=0.0)
        read = _prompt_ids(fields, tokenizer)
        body = ids[1:] if bos is not None and ids[:1] == [bos] else ids
        cut = max(0, split - (len(ids) - len(body)))
        mismatched += not (_holds(read, body) if endpoint == "completions" else
                           _holds(read, body[:cut]) and _holds(read, body[cut:]))
        requests.append(ServeRequest(i, endpoint, fields, len(read)))
    return ServeWorkload(name, requests, {**wl.params, "endpoint": endpoint,
                                          "not_round_trip": mismatched})


def text_requests(name: str, tokenizer, endpoint: str = "completions", *,
                  num_prompts: int = 64, seed: int = 0) -> ServeWorkload:
    """The text workload or mix ``name`` (:data:`~mlxpa.bench.text_workloads.TEXT_NAMES`) as
    greedy requests to ``endpoint``: each prompt as the completions ``prompt`` or as one
    user message, its ``max_tokens`` and ``stop`` strings, ``ignore_eos`` false.

    Raises:
        ValueError: An unknown name or endpoint, ``num_prompts`` < 1, or ``chat`` to a model
            without a chat template.
    """
    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
    requests = []
    for i, row in enumerate(text_prompts(name, num_prompts, seed)):
        fields: dict = ({"prompt": row.text} if endpoint == "completions" else
                        {"messages": [{"role": "user", "content": row.text}]})
        fields.update(max_tokens=row.max_tokens, temperature=0.0, ignore_eos=False)
        if row.stop:
            fields["stop"] = list(row.stop)
        requests.append(_request(i, endpoint, fields, tokenizer))
    return ServeWorkload(name, requests, {**text_params(name, num_prompts, seed),
                                          "endpoint": endpoint})


def file_requests(tokenizer, path: str, output_len: int = 32) -> ServeWorkload:
    """Every valid row of ``path`` (any input ``mlxpa run`` reads, OpenAI Batch lines too) as a
    request: ``messages`` to the chat endpoint, ``prompt`` (text or token ids) to the
    completions endpoint (an OpenAI Batch line: to its ``url``); ``max_tokens`` the row's or
    ``output_len``, ``temperature`` the row's or 0; the row's other sampling fields
    (:data:`~mlxpa.inputs.schema.SAMPLING_FIELDS`) are sent as given.

    Invalid rows are left out, as are rows with ``max_tokens`` 0: ``params`` counts them
    (``invalid_rows``, ``empty_rows``) and names the first problems (``problems``); rows
    whose constraint or log-probability fields are not sent are counted in
    ``params["unsent_fields_rows"]``.

    Raises:
        InputError: The file cannot be read, or has no row to send.
    """
    from mlxpa.data import InputError
    from mlxpa.data.read import input_format, read_rows, unit_of
    from mlxpa.data.reader_options import where

    requests, problems, invalid, empty, unsent = [], [], 0, 0, 0
    unit = unit_of(input_format(path))
    for row in read_rows(path):
        error = row.error
        if error is None:
            fields, kind = _row_fields(row, output_len)
            try:
                request = _request(len(requests), kind, fields, tokenizer)
            except ValueError as e:
                error = f"{where(path, row.line, unit)}: {e}"
        if error is not None:
            invalid += 1
            if len(problems) < 5:
                problems.append(error)
            continue
        if fields["max_tokens"] == 0:
            empty += 1
            continue
        unsent += any(k not in SAMPLING_FIELDS for k in row.params)
        requests.append(request)
    if not requests:
        detail = "; ".join(problems) if problems else "no row with tokens to generate"
        raise InputError(f"nothing to send ({detail})", source=path)
    return ServeWorkload("file", requests, dict(
        path=path, output_len=output_len, invalid_rows=invalid, problems=problems,
        empty_rows=empty, unsent_fields_rows=unsent))


def _row_fields(row: Row, output_len: int) -> tuple[dict, str]:
    """The body fields of a valid row and its endpoint."""
    if row.messages is not None:
        fields, kind = {"messages": row.messages}, "chat"
        if row.chat_template_kwargs:
            fields["chat_template_kwargs"] = row.chat_template_kwargs
    else:
        prompt = row.prompt if row.prompt is not None else list(row.prompt_token_ids)
        fields, kind = {"prompt": prompt}, "completions"
    fields.update({k: v for k, v in row.params.items() if k in SAMPLING_FIELDS})
    fields.setdefault("max_tokens", output_len)
    fields.setdefault("temperature", 0.0)
    return fields, row.openai or kind
