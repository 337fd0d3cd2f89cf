"""The gate listing shows every gate: README's section is its output, and no code judges a gate
outside the functions it names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from flows import gates
from flows._stage import REPO_ROOT

README = REPO_ROOT / "flows" / "README.md"
_BEGIN, _END = "<!-- gates begin -->\n", "<!-- gates end -->"


def _judging_functions(root: Path) -> set[tuple[str, str]]:
    """(file, function) of every call that judges a gate (`Gate(...)`, `Gate.judge(...)`,
    `holds(...)`) in the packages' sources and the flows; `adrkit.schema`, which defines them,
    aside."""
    found = set()
    files = [*root.glob("packages/*/src/**/*.py"), *root.glob("flows/*.py")]
    for path in files:
        relative = path.relative_to(root).as_posix()
        if relative == "packages/adr/src/adrkit/schema.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and _judges(node.func):
                    found.add((relative, function.name))
    return found


def _judges(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in {"Gate", "holds"}
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "judge"
        and isinstance(func.value, ast.Name)
        and func.value.id == "Gate"
    )


def _unlisted(root: Path) -> set[tuple[str, str]]:
    listed = {(path, name) for path, names in gates.JUDGED_IN.items() for name in names}
    return _judging_functions(root) - listed


def test_every_judged_gate_is_listed() -> None:
    assert _unlisted(REPO_ROOT) == set()


def test_a_planted_unlisted_gate_is_found(tmp_path: Path) -> None:
    planted = tmp_path / "packages" / "bench" / "src" / "kvbench" / "_planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text(
        "from adrkit.schema import Gate\n\n\n"
        "def new_gate(v):\n    return Gate.judge('x', v, '<=', 1)\n"
    )
    assert _unlisted(tmp_path) == {("packages/bench/src/kvbench/_planted.py", "new_gate")}


def test_every_listed_function_judges_a_gate() -> None:
    """A listed function that no longer judges anything is a stale entry."""
    listed = {(path, name) for path, names in gates.JUDGED_IN.items() for name in names}
    assert listed <= _judging_functions(REPO_ROOT)


def test_readme_shows_the_listing() -> None:
    text = README.read_text(encoding="utf-8")
    shown = text[text.index(_BEGIN) + len(_BEGIN) : text.index(_END)]
    assert shown == gates.gates_markdown(gates.all_gates())


def test_every_gate_has_a_threshold_and_a_reason() -> None:
    entries = gates.all_gates()
    stages = {e.stage for e in entries}
    assert {"audit", "kernels", "correctness", "accuracy", "throughput"} <= stages
    assert all(e.why for e in entries if not e.stage.startswith("ADR")), [
        e.name for e in entries if not e.why
    ]


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert gates.main([]) == 0
    assert capsys.readouterr().out.startswith("| gate | stage |")
    assert gates.main(["--bogus"]) == 2
