"""Shared fixtures: the real default model (SmolLM2-135M-Instruct) loaded once, fp32 on the CPU."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from kvbench.accuracy import cli as accuracy_cli
from kvbench.accuracy._config import TASKS_DIR


def run_cli(argv: list[str]) -> int:
    """``kvbench accuracy ...`` in this process; the exit code the command would return."""
    parser = argparse.ArgumentParser(prog="kvbench")
    accuracy_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


@pytest.fixture(scope="session")
def smollm2() -> Any:
    from kvbench.accuracy._hf_model import load_model

    return load_model(None, "cpu")


def build_requests(task_name: str, limit: int) -> list[Any]:
    """lm-eval Instances of the first ``limit`` documents of one offline task."""
    from lm_eval.tasks import TaskManager, get_task_dict

    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    task = get_task_dict([task_name], manager)[task_name]
    task.build_all_requests(limit=limit, rank=0, world_size=1)
    instances: list[Any] = task.instances
    return instances
