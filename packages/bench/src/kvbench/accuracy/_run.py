"""run_accuracy: each configured task run scores its tasks with the baseline and the candidate
KV cache through lm-eval, then pairs the per-item scores into gated rows and a plot; each
divergence run compares the two caches' next-token distributions on running text, with its
controls (`_divergence`), needing no lm-eval.

Resuming: every request's result goes to an lm-eval cache database named for the model, mode,
cache dtype and prefill setting under ``out_dir/lm-eval-cache``; a rerun after an interruption
reads the finished requests from it and computes only the rest.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvquant import output_problem

from .._vllm_env import (
    VLLM_PYTHON_ENV,
    VLLMEnvironment,
    VLLMEnvironmentError,
    vllm_environment,
)
from ._config import (
    TASKS_DIR,
    AccuracyConfig,
    RunSpec,
    check_attention,
    check_device,
    load_config,
)
from ._errors import (
    BackendMissingError,
    ConfigError,
    EngineStartError,
    OutputError,
    UnknownTaskError,
)
from ._model_files import go_offline, resolve_model, weights_source
from ._result import AccuracyResult, DivergenceResult
from ._stats import gate_passes, paired_stats, verdict

# Per-sample metrics that are (log-likelihood, weight) pairs, scored per item as the negative
# log-likelihood per unit, and the row name that says so.
_WEIGHTED_METRICS = {"word_perplexity": "nll_per_word"}
_BINARY_METRICS = ("acc", "exact_match")
PLOT_NAME = "accuracy_deltas.png"
RESULT_NAME = "accuracy.json"
# `kvbench divergence` writes its result here instead, so both commands can share a folder.
DIVERGENCE_RESULT_NAME = "divergence.json"


def _check_tasks(config: AccuracyConfig) -> Any:
    from lm_eval.tasks import TaskManager  # type: ignore[import-untyped]

    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    known = set(manager.all_tasks)
    for run in config.runs:
        for task in run.tasks:
            if task not in known:
                msg = f"task {task!r} is unknown; expected one of {', '.join(sorted(known))}"
                raise UnknownTaskError(msg)
    return manager


def _item_scores(samples: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """metric row name -> {doc_id: score} from lm-eval's logged samples of one task."""
    scores: dict[str, dict[int, float]] = {}
    for sample in samples:
        doc_id = int(sample["doc_id"])
        for metric in _BINARY_METRICS:
            if metric in sample:
                scores.setdefault(metric, {})[doc_id] = float(sample[metric])
        for metric, row_name in _WEIGHTED_METRICS.items():
            if metric in sample:
                loglikelihood, weight = sample[metric]
                scores.setdefault(row_name, {})[doc_id] = -float(loglikelihood) / float(weight)
    return scores


def _evaluate(
    lm: Any, run: RunSpec, manager: Any, cache_path: Path
) -> dict[str, dict[str, dict[int, float]]]:
    """task -> metric -> {doc_id: score} for one model over one run's tasks."""
    from lm_eval import simple_evaluate  # type: ignore[import-untyped]

    cache_path.parent.mkdir(parents=True, exist_ok=True)
    results = simple_evaluate(
        model=lm,
        tasks=list(run.tasks),
        limit=run.limit,
        task_manager=manager,
        use_cache=str(cache_path),
        log_samples=True,
        bootstrap_iters=0,
        verbosity="WARNING",
    )
    if results is None:  # only non-zero ranks of a distributed run get None
        return {}
    return {task: _item_scores(results["samples"][task]) for task in run.tasks}


def _rows(
    run: RunSpec,
    baseline: dict[str, dict[str, dict[int, float]]],
    candidate: dict[str, dict[str, dict[int, float]]],
    tolerance: float,
) -> list[dict[str, Any]]:
    rows = []
    for task in run.tasks:
        for metric, base_items in baseline.get(task, {}).items():
            cand_items = candidate[task][metric]
            doc_ids = sorted(set(base_items) & set(cand_items))
            stats = paired_stats([base_items[d] for d in doc_ids], [cand_items[d] for d in doc_ids])
            rows.append(
                {
                    "task": task,
                    "metric": metric,
                    "mode": run.mode,
                    "baseline": stats.baseline,
                    "int8": stats.candidate,
                    "delta": stats.delta,
                    "stderr": stats.stderr,
                    "ci_low": stats.ci_low,
                    "ci_high": stats.ci_high,
                    "n": stats.n,
                    "flips_up": stats.flips_up,
                    "flips_down": stats.flips_down,
                    "mcnemar_p": stats.mcnemar_p,
                    "detectable_delta": stats.detectable_delta,
                    "gate_passed": gate_passes(stats, tolerance),
                    "verdict": verdict(stats, tolerance),
                }
            )
    return rows


_VERDICT_COLORS = {"passed": "tab:blue", "inconclusive": "0.55", "failed": "tab:red"}


def plot_deltas(rows: list[dict[str, Any]], tolerance: float, path: Path) -> None:
    """Horizontal bars: each row's delta with its 95% CI, and the +-tolerance band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['task']} {r['metric']} ({r['mode']})" for r in rows]
    deltas = [r["delta"] for r in rows]
    errors = [[r["delta"] - r["ci_low"] for r in rows], [r["ci_high"] - r["delta"] for r in rows]]
    colors = [_VERDICT_COLORS[r["verdict"]] for r in rows]
    figure, axes = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.5))
    axes.axvspan(-tolerance, tolerance, color="0.9", label=f"tolerance ±{tolerance:g}")
    axes.axvline(0.0, color="0.4", linewidth=0.8)
    positions = list(range(len(rows)))
    axes.errorbar(deltas, positions, xerr=errors, fmt="none", ecolor="0.3", capsize=3)
    axes.scatter(deltas, positions, c=colors, zorder=3)
    axes.set_yticks(positions, labels)
    axes.invert_yaxis()
    axes.set_xlabel("INT8 - baseline (95% CI); red: gate failed, grey: inconclusive")
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# One run's scores with one cache: task -> metric -> {doc_id: score}.
_Scorer = Callable[[RunSpec, str], dict[str, dict[str, dict[int, float]]]]


def _hf_scorer(
    cfg: AccuracyConfig, manager: Any, out_dir: Path, progress: bool, loaded: Any
) -> _Scorer:
    """kvquant-hf: one HF model (``loaded``: model and tokenizer), read through each cache."""
    from ._lm import KVQuantHFLM

    hf_model, tokenizer = loaded
    model_name = resolve_model(cfg.model).name
    prefill = "prefill-reads-cache" if cfg.prefill_reads_cache else "prefill-fresh"

    def score(run: RunSpec, kv_cache_dtype: str) -> dict[str, dict[str, dict[int, float]]]:
        lm = KVQuantHFLM(
            kv_cache_dtype=kv_cache_dtype,
            prefill_reads_cache=cfg.prefill_reads_cache,
            score_mode="decode" if run.mode == "decode" else "single-pass",
            max_length=cfg.max_length,
            loaded=(hf_model, tokenizer),
            progress=progress,
        )
        cache_name = f"{model_name}-{cfg.dtype}-{run.mode}-{kv_cache_dtype}-{prefill}"
        return _evaluate(lm, run, manager, out_dir / "lm-eval-cache" / cache_name)

    return score


def _vllm_scorer(cfg: AccuracyConfig, manager: Any, out_dir: Path) -> _Scorer:
    """lm-eval's vllm: a fresh engine per run and cache, shut down once its tasks are scored."""
    from ._model_files import check_has_kv_cache
    from ._vllm_backend import VLLM_KV_CACHE_DTYPES, shut_down, vllm_lm

    model_dir = resolve_model(cfg.model)
    check_has_kv_cache(model_dir)

    def score(run: RunSpec, kv_cache_dtype: str) -> dict[str, dict[str, dict[int, float]]]:
        lm = vllm_lm(
            model_dir,
            kv_cache_dtype,
            device=cfg.device,
            dtype=cfg.dtype,
            max_length=cfg.max_length,
        )
        engine_cache = VLLM_KV_CACHE_DTYPES[kv_cache_dtype]
        cache_name = f"{model_dir.name}-{cfg.dtype}-{run.mode}-vllm-{engine_cache}"
        try:
            return _evaluate(lm, run, manager, out_dir / "lm-eval-cache" / cache_name)
        finally:
            shut_down(lm)

    return score


def _vllm_environment() -> VLLMEnvironment:
    try:
        environment = vllm_environment()
    except VLLMEnvironmentError as error:
        raise BackendMissingError(str(error)) from None
    if environment.separate and not environment.found:
        msg = f"backend 'vllm' needs vLLM, not installed for {VLLM_PYTHON_ENV}={environment.python}"
        raise BackendMissingError(msg)
    return environment


def _run_in(
    python: str,
    config: Path | None,
    overrides: dict[str, Any],
    out_dir: Path,
    progress: bool,
) -> AccuracyResult:
    """The same run by ``python``'s kvbench (vLLM's own environment), read back from its
    ``accuracy.json``; its one-line error becomes this one's."""
    argv = [python, "-m", "kvbench", "accuracy", "--out", str(out_dir)]
    argv += ["--config", str(config)] if config is not None else []
    for name, value in overrides.items():
        argv += [f"--{name}", str(value)] if value is not None else []
    argv += [] if progress else ["--quiet"]
    # The child runs vLLM itself: it must not look for another environment in turn.
    env = {k: v for k, v in os.environ.items() if k != VLLM_PYTHON_ENV}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    # Its whole output is this run's log (vLLM logs to stdout); the result is printed once, here.
    sys.stderr.write(done.stdout)
    lines = done.stderr.rstrip("\n").splitlines()
    if done.returncode != 0:
        last = lines.pop() if lines else f"exit status {done.returncode}"
        sys.stderr.writelines(line + "\n" for line in lines)  # the engines' own log
        msg = f"kvbench accuracy in {python}: {last.removeprefix('kvbench accuracy: error: ')}"
        raise EngineStartError(msg)
    sys.stderr.writelines(line + "\n" for line in lines)
    return AccuracyResult.read(out_dir / RESULT_NAME)


def run_accuracy(
    config: Path | None = None,
    *,
    model: str | None = None,
    device: str | None = None,
    limit: int | None = None,
    out_dir: Path,
    progress: bool = True,
    divergence_only: bool = False,
    divergence_overrides: dict[str, Any] | None = None,
) -> AccuracyResult:
    """Run every configured run with the baseline and candidate caches; pair, gate and plot.

    ``model``, ``device`` and ``limit`` override the config, ``divergence_overrides`` its
    divergence runs (`load_config`). ``divergence_only`` runs the divergence runs alone, without
    lm-eval, and writes ``divergence.json`` instead of ``accuracy.json``. Writes the result (its
    ``to_dict()``) and the plots into ``out_dir`` and returns it. A bad config or override, or
    an ``out_dir`` that cannot be written, is refused before the model loads.
    """
    started = time.perf_counter()
    go_offline()
    cfg = load_config(config, divergence_overrides)
    if model is not None:
        cfg = replace(cfg, model=model)
    if device is not None:
        check_device(device, cfg.backend, "device")
        cfg = replace(cfg, device=device)
    paths = [
        check_attention(spec, cfg.device, "model.device" if device is None else "device")
        for spec in cfg.divergence
    ]
    if divergence_only:
        if not cfg.divergence:
            source = "the embedded config" if config is None else f"`config` {config}"
            raise ConfigError(
                f"{source} has no divergence run; expected a [[runs]] table with "
                'mode = "divergence"'
            )
        cfg = replace(cfg, runs=())
    problem = output_problem(out_dir, "output folder", folder=True)
    if problem is not None:
        raise OutputError(problem)
    if limit is not None:
        cfg = replace(cfg, runs=tuple(replace(run, limit=limit) for run in cfg.runs))
    logging.getLogger("lm-eval").setLevel(logging.WARNING)
    if cfg.backend == "vllm":
        environment = _vllm_environment()
        if environment.separate:
            overrides = {"model": model, "device": device, "limit": limit}
            return _run_in(environment.python, config, overrides, out_dir, progress)
        from ._vllm_backend import prepare_vllm

        prepare_vllm()  # before lm-eval's task loading can import vLLM
    manager = _check_tasks(cfg) if cfg.runs else None
    loaded = None
    if cfg.backend == "kvquant-hf":
        from ._hf_model import load_model

        loaded = load_model(cfg.model, cfg.device, cfg.dtype)
    rows: list[dict[str, Any]] = []
    # Seconds per run and cache, lm-eval's task setup (and for vllm the engine start) included,
    # to track the INT8 / 16-bit cost ratio; a resumed run counts only the requests it
    # recomputed.
    timings: list[dict[str, Any]] = []
    if cfg.runs:
        score = (
            _vllm_scorer(cfg, manager, out_dir)
            if cfg.backend == "vllm"
            else _hf_scorer(cfg, manager, out_dir, progress, loaded)
        )
        for run in cfg.runs:
            scores = []
            for kv_cache_dtype in (cfg.baseline, cfg.candidate):
                run_started = time.perf_counter()
                scores.append(score(run, kv_cache_dtype))
                timings.append(
                    {
                        "mode": run.mode,
                        "tasks": list(run.tasks),
                        "kv_cache_dtype": kv_cache_dtype,
                        "seconds": time.perf_counter() - run_started,
                    }
                )
            rows += _rows(run, scores[0], scores[1], cfg.tolerance)
    out_dir.mkdir(parents=True, exist_ok=True)
    divergence: list[DivergenceResult] = []
    if cfg.divergence:
        from ._decode_divergence import run_decode_divergence
        from ._divergence import plot_name, run_divergence

        assert loaded is not None and cfg.divergence_gate is not None  # kvquant-hf, load_config
        for index, (spec, spec_paths) in enumerate(zip(cfg.divergence, paths, strict=True)):
            scorer = run_decode_divergence if spec.kernel == "decode" else run_divergence
            divergence.append(
                scorer(
                    spec,
                    cfg.divergence_gate,
                    spec_paths,
                    model=loaded[0],
                    tokenizer=loaded[1],
                    baseline=cfg.baseline,
                    candidate=cfg.candidate,
                    plot_path=out_dir / plot_name(index),
                    progress=progress,
                )
            )
    plot_path = None
    if rows:
        plot_path = out_dir / PLOT_NAME
        plot_deltas(rows, cfg.tolerance, plot_path)
    name = DIVERGENCE_RESULT_NAME if divergence_only else RESULT_NAME
    result = AccuracyResult(
        backend=cfg.backend,
        model=resolve_model(cfg.model).name,
        device=cfg.device,
        tasks=sorted({task for run in cfg.runs for task in run.tasks}),
        rows=rows,
        divergence=divergence,
        tolerance=cfg.tolerance,
        plot=None if plot_path is None else str(plot_path),
        timings=timings,
        elapsed_s=time.perf_counter() - started,
        results_file=str(out_dir / name),
        weights="" if loaded is None else weights_source(cfg.model),
        model_dtype="" if loaded is None else str(loaded[0].dtype).removeprefix("torch."),
    )
    (out_dir / name).write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    return result
