"""The task baselines are right: a delta between caches is never a template or scoring artefact.

- Every shipped task, scored by kvquant-hf with the 16-bit (`auto`) cache, gives what lm-eval's
  own HF model (``lm_eval.models.huggingface.HFLM``) gives on the same items, prompts and model:
  log-likelihoods within 1e-4, the same per-item scores, the same generations.
- Each multiple-choice task asks exactly what lm-eval's own task of the same name asks (its YAML
  as lm-eval ships it, pointed at the same local data): the same contexts, continuations and
  targets, item by item.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvbench.accuracy._config import TASKS_DIR
from kvbench.accuracy._lm import KVQuantHFLM
from kvbench.accuracy._model_files import resolve_model

pytest.importorskip("lm_eval")

SHIPPED_TASKS = sorted(path.stem for path in TASKS_DIR.glob("kvb_*.yaml"))
# Items per task: a few, and fewer where one item is long (gsm8k's 5-shot prompt and answer).
_LIMITS = {"kvb_gsm8k": 1, "kvb_lambada_ppl": 2}
_ITEMS = 3
# gsm8k answers run up to 128 tokens; 40 tokens of it take the same path at a third of the time.
_GEN_KWARGS = {"kvb_gsm8k": "max_gen_toks=40"}
_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def plain_hf() -> Any:
    from lm_eval.models.huggingface import HFLM

    model_dir = str(resolve_model(None))
    return HFLM(pretrained=model_dir, device="cpu", dtype="float32", batch_size=1, max_length=2048)


def _samples(lm: Any, task: str) -> list[dict[str, Any]]:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    results = simple_evaluate(
        model=lm,
        tasks=[task],
        limit=_LIMITS.get(task, _ITEMS),
        gen_kwargs=_GEN_KWARGS.get(task),
        task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
        verbosity="ERROR",
    )
    samples: list[dict[str, Any]] = results["samples"][task]
    return sorted(samples, key=lambda sample: sample["doc_id"])


def _responses(sample: dict[str, Any]) -> list[Any]:
    """One entry per request of the item: (log-likelihood, greedy), a log-likelihood, or text."""
    return [response[0] for response in sample["resps"]]


def test_every_shipped_task_is_covered() -> None:
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    assert sorted(manager.all_tasks) == SHIPPED_TASKS


@pytest.mark.parametrize("task", SHIPPED_TASKS)
def test_auto_baseline_equals_lm_evals_hf_model(task: str, smollm2: Any, plain_hf: Any) -> None:
    ours = _samples(KVQuantHFLM(kv_cache_dtype="auto", loaded=smollm2, progress=False), task)
    theirs = _samples(plain_hf, task)
    assert [s["doc_id"] for s in ours] == [s["doc_id"] for s in theirs]
    for mine, harness in zip(ours, theirs, strict=True):
        assert mine["arguments"] == harness["arguments"]
        assert mine["target"] == harness["target"]
        for got, expected in zip(_responses(mine), _responses(harness), strict=True):
            if isinstance(expected, str):
                assert got == expected  # a generation
            elif isinstance(expected, (list, tuple)):  # (log-likelihood, greedy)
                assert got[0] == pytest.approx(expected[0], abs=_TOLERANCE)
                assert bool(got[1]) == bool(expected[1])
            else:  # a rolling log-likelihood
                assert got == pytest.approx(expected, abs=_TOLERANCE)
        for metric in ("acc", "exact_match"):
            assert mine.get(metric) == harness.get(metric)


# lm-eval's own task of the same name (its shipped YAML), and the local data that the kvbench
# task reads: (harness YAML under lm_eval/tasks, kvbench task, data subdir, process_docs).
_HARNESS_TASKS = {
    "arc_easy": ("arc/arc_easy.yaml", "kvb_arc_easy", "ai2_arc/ARC-Easy/validation", None),
    "arc_challenge": (
        "arc/arc_challenge.yaml",
        "kvb_arc_challenge",
        "ai2_arc/ARC-Challenge/validation",
        None,
    ),
    # The harness reads SuperGLUE's copy, whose target is `label` (0: no, 1: yes); the local
    # copy (HF `boolq`) holds the same items with `answer` as a boolean.
    "boolq": ("super_glue/boolq/default.yaml", "kvb_boolq", "boolq/none/validation", "label"),
    "piqa": ("piqa/piqa.yaml", "kvb_piqa", "piqa/plain_text/validation", None),
    "winogrande": (
        "winogrande/default.yaml",
        "kvb_winogrande",
        "winogrande/winogrande_xl/validation",
        None,
    ),
    "hellaswag": ("hellaswag/hellaswag.yaml", "kvb_hellaswag", "hellaswag/none/validation", None),
}
_LOCAL_DATA = """
import datasets
from kvbench.accuracy._eval_data import data_root


def load(subdir, **_):
    path = data_root() / "hf_datasets" / subdir
    return datasets.DatasetDict({"test": datasets.load_from_disk(path)})


def label(dataset):
    return dataset.map(lambda doc: {"label": int(doc["answer"])})
"""


def _harness_task_dir(tmp_path: Path, name: str) -> Path:
    """lm-eval's YAML for ``name``, included as shipped, with only its data source replaced."""
    import lm_eval

    yaml, _, subdir, process = _HARNESS_TASKS[name]
    shipped = Path(lm_eval.__file__).parent / "tasks" / yaml
    (tmp_path / "local_data.py").write_text(_LOCAL_DATA, encoding="utf-8")
    lines = [
        f"include: {shipped}",
        f"task: harness_{name}",
        "dataset_path: local",
        "dataset_name: null",
        "custom_dataset: !function local_data.load",
        f"dataset_kwargs: {{subdir: {subdir}}}",
        "training_split: null",
        "validation_split: null",
        "test_split: test",
    ]
    if process == "label":
        lines.append("process_docs: !function local_data.label")
    (tmp_path / f"harness_{name}.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tmp_path


def _task(name: str, include_path: Path) -> Any:
    from lm_eval.tasks import TaskManager, get_task_dict

    manager = TaskManager(include_path=str(include_path), include_defaults=False)
    task = get_task_dict([name], manager)[name]
    task.build_all_requests(limit=_HARNESS_ITEMS, rank=0, world_size=1)
    return task


_HARNESS_ITEMS = 20


@pytest.mark.parametrize("name", sorted(_HARNESS_TASKS))
def test_multiple_choice_tasks_ask_what_lm_evals_own_tasks_ask(name: str, tmp_path: Path) -> None:
    harness = _task(f"harness_{name}", _harness_task_dir(tmp_path, name))
    ours = _task(_HARNESS_TASKS[name][1], TASKS_DIR)
    assert len(ours.instances) == len(harness.instances) >= 2 * _HARNESS_ITEMS
    for mine, theirs in zip(ours.instances, harness.instances, strict=True):
        assert (mine.doc_id, mine.idx) == (theirs.doc_id, theirs.idx)
        assert mine.arguments == theirs.arguments
    docs = zip(ours.eval_docs, harness.eval_docs, strict=False)
    targets = [(ours.doc_to_target(a), harness.doc_to_target(b)) for a, b in docs]
    assert len(targets) >= _HARNESS_ITEMS
    assert all(mine == theirs for mine, theirs in targets), targets
