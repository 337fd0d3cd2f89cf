"""Every gate of the nightly in one listing: name, stage, comparison, threshold, where it is
defined and why that threshold.

`python -m flows.gates` prints the listing as Markdown (flows/README.md's "Gates" section is its
output). The listing reads each gate from the file that defines it, so it cannot drift from them:
the stages' gates (gates.toml), the kernel build's resource gates (the nightly build matrix),
kvbench's accuracy and divergence gates and its throughput regression rule (the configs the
stages run by default), and the ADR decision rows' gates (docs/adr/decisions.toml). Each row's
"why" is the comment its file gives it. Code that judges a gate is named in `JUDGED_IN`; a test
fails on a gate judged anywhere else.
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from adrkit.schema import COMPARISONS
from flows._stage import ADR_DIR, GATES_FILE, REPO_ROOT
from flows.kernels import NIGHTLY_MATRIX
from kvquant.build import GATES as BUILD_GATES

# The code that judges gates (an `adrkit.schema` `Gate` or `holds`), by file and function. Each is
# listed below from the file that declares its thresholds.
JUDGED_IN = {
    "flows/_stage.py": ("stage_gates",),
    "packages/kvquant/src/kvquant/build/_build.py": ("_gates",),
    # The build matrix's gates, carried into the kernels stage's record.
    "packages/kvquant/src/kvquant/build/_result.py": ("record_parts",),
    "packages/kvquant/src/kvquant/build/_tritons.py": ("record_parts",),
    "packages/bench/src/kvbench/accuracy/_result.py": (
        "delta_gate",
        "divergence_gates",
        "agreement_gate",
    ),
    "packages/adr/src/adrkit/_summary.py": ("_verdict",),
}
# How kvbench's accuracy gates compare each config value (kvbench.accuracy._result): the task
# rows' |delta| against max(tolerance, 2 stderr), the divergence rows' three figures, the
# attention paths' difference in mean KLD.
_ACCURACY_OPS = {
    "tolerance": "<=",
    "max_mean_kld": "<=",
    "min_same_top1": ">=",
    "max_ppl_ratio": "<=",
    "path_agreement": "<=",
}
# kvbench's throughput regression rule (kvbench.throughput._regression): a cell regressed when
# it is worse than its history's median by more than noise_sigmas robust deviations and by more
# than min_change of the median, judged once min_history runs exist of the last history_runs.
_REGRESSION_OPS = {
    "noise_sigmas": ">",
    "min_change": ">",
    "min_history": ">=",
    "history_runs": "<=",
}


@dataclass(frozen=True)
class GateEntry:
    """One gate: what it judges, in which stage, against what, declared where, and why."""

    name: str
    stage: str
    op: str
    threshold: float
    where: str
    why: str


def all_gates() -> list[GateEntry]:
    """Every gate, in pipeline order: audit, kernels, correctness, accuracy, throughput, then
    the ADR decision rows."""
    entries = list(_stage_gates())
    order = ["audit", "kernels", "correctness", "accuracy", "throughput"]
    entries += _build_gates()
    entries += _accuracy_gates()
    entries += _regression_gates()
    entries.sort(key=lambda e: order.index(e.stage) if e.stage in order else len(order))
    return entries + list(_decision_gates())


def _relative(path: Path) -> str:
    return path.resolve().relative_to(REPO_ROOT).as_posix()


def _comments(text: str) -> dict[tuple[str, str], str]:
    """Each key's comment in a TOML text, by (table, key): the comment lines above it, which
    also hold for the keys after it up to a blank line, and its own line's comment. An array of
    tables' entries are numbered, ``name[0]``."""
    found: dict[tuple[str, str], str] = {}
    table, above, group = "", list[str](), ""
    seen: dict[str, int] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            above, group = [], ""
        elif stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
        elif header := re.fullmatch(r"\[\[?([^\]]+)\]\]?", stripped):
            table = header.group(1)
            if stripped.startswith("[["):
                seen[table] = seen.get(table, -1) + 1
                table = f"{table}[{seen[table]}]"
            above, group = [], ""
        elif key := re.match(r"([A-Za-z0-9_-]+)\s*=", stripped):
            group = " ".join(above) or group
            inline = stripped.partition("#")[2].strip()
            found[(table, key.group(1))] = " ".join(filter(None, [group, inline]))
            above = []
    return found


def _stage_gates() -> Iterator[GateEntry]:
    text = GATES_FILE.read_text(encoding="utf-8")
    why = _comments(text)
    for stage, gates in tomllib.loads(text).items():
        for metric, rule in gates.items():
            yield GateEntry(
                metric,
                stage,
                rule["op"],
                float(rule["threshold"]),
                f"{_relative(GATES_FILE)} [{stage}]",
                why.get((stage, metric), ""),
            )


def _build_gates() -> Iterator[GateEntry]:
    text = NIGHTLY_MATRIX.read_text(encoding="utf-8")
    default = resources.files("kvquant.build").joinpath("default_matrix.toml").read_text()
    why, default_why = _comments(text), _comments(default)
    for name, threshold in tomllib.loads(text)["gates"].items():
        field, op = BUILD_GATES[name]
        yield GateEntry(
            f"{name} ({field}, every cell)",
            "kernels",
            op,
            float(threshold),
            f"{_relative(NIGHTLY_MATRIX)} [gates]",
            why.get(("gates", name)) or default_why.get(("gates", name), ""),
        )


def _accuracy_gates() -> Iterator[GateEntry]:
    source = resources.files("kvbench.accuracy").joinpath("cpu_nightly.toml")
    text = source.read_text()
    why = _comments(text)
    for name, threshold in tomllib.loads(text)["gate"].items():
        yield GateEntry(
            name,
            "accuracy",
            _ACCURACY_OPS[name],
            float(threshold),
            "kvbench/accuracy/cpu_nightly.toml [gate]",
            why.get(("gate", name), ""),
        )


def _regression_gates() -> Iterator[GateEntry]:
    text = resources.files("kvbench.throughput").joinpath("cpu_nightly.toml").read_text()
    why = _comments(text)
    for name, threshold in tomllib.loads(text)["gates"].items():
        yield GateEntry(
            f"regression rule: {name}",
            "throughput",
            _REGRESSION_OPS[name],
            float(threshold),
            "kvbench/throughput/cpu_nightly.toml [gates]",
            why.get(("gates", name)) or "the regression rule (kvbench.throughput._regression)",
        )


def _decision_gates() -> Iterator[GateEntry]:
    path = ADR_DIR / "decisions.toml"
    text = path.read_text(encoding="utf-8")
    why = _comments(text)
    for block, rows in tomllib.loads(text).items():
        if not isinstance(rows, list):
            continue
        for index, row in enumerate(rows):
            if "gate" in row:
                yield GateEntry(
                    row["answer"],
                    f"ADR {block}",
                    row["gate"]["op"],
                    float(row["gate"]["threshold"]),
                    f"{_relative(path)} [[{block}]]",
                    why.get((f"{block}[{index}]", "gate"), ""),
                )


def gates_markdown(entries: Sequence[GateEntry]) -> str:
    """The listing as a Markdown table."""
    lines = [
        "| gate | stage | passes when | defined in | why |",
        "|---|---|---|---|---|",
    ]
    for e in entries:
        assert e.op in COMPARISONS, e
        why = e.why.replace("|", "\\|")
        lines.append(f"| `{e.name}` | {e.stage} | {e.op} {e.threshold:g} | `{e.where}` | {why} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    if argv:
        print("usage: python -m flows.gates (no arguments)", file=sys.stderr)
        return 2
    sys.stdout.write(gates_markdown(all_gates()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
