"""Stage `accuracy`: what does the INT8 KV cache cost in accuracy?

Runs `kvbench accuracy`: the paired lm-eval comparison of the 16-bit and the INT8 cache on a real
model, and the token-level divergence of the two caches on running text with its two controls.
kvbench's result gives the record (`kvbench.accuracy.AccuracyResult.record_parts`): the `deltas`
and `divergence` tables with their gates; the controls are gated here through gates.toml
(`divergence_controls_failed`). Fills ADR 0009's accuracy and divergence blocks, with the plot of
the deltas and of the KLDs.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task

from adrkit.schema import Record
from flows._stage import RunContext, run_stage
from kvbench.accuracy import AccuracyResult

STAGE = "accuracy"


# Not log_prints: the libraries under lm-eval print whole bytecode disassemblies of the task
# code (seen in the nightly log); kvbench's own result is the record.
@task(log_prints=False)
def run_benchmark(
    out_dir: Path, config: str | None, model: str | None, device: str | None, limit: int | None
) -> AccuracyResult:
    from kvbench.accuracy import run_accuracy

    return run_accuracy(
        Path(config) if config else None,
        model=model,
        device=device,
        limit=limit,
        out_dir=out_dir,
        progress=False,
    )


@flow(name="accuracy", flow_run_name="accuracy-{run_id}", log_prints=True)
def accuracy_stage(
    run_id: str,
    results_root: Path,
    config: str | None = None,
    model: str | None = None,
    device: str | None = None,
    limit: int | None = None,
    flow_run_id: str | None = None,
) -> Record:
    """Paired lm-eval comparison of the 16-bit and the INT8 KV cache (kvbench's config by
    default: SmolLM2-135M on the CPU)."""
    return run_stage(
        STAGE,
        RunContext(run_id, Path(results_root), flow_run_id),
        lambda out_dir: run_benchmark(out_dir, config, model, device, limit).record_parts(),
        title="INT8 KV cache accuracy",
        table="deltas",
        gpu=True,
    )
