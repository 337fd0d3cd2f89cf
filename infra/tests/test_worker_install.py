"""The accelerator nodes' install lists against what the packages and flows actually need.

A worker runs every stage the pipeline sends to its pool (correctness, accuracy, throughput), so
it needs all four packages and every third-party dependency they declare, while the vendor's
torch and Triton must come from the base image alone.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
PACKAGES = ("adr", "audit", "kvquant", "bench")
# What the stages import from kvbench: its accuracy and throughput extras.
BENCH_EXTRAS = ("accuracy", "throughput")
# The base image's, never installed from a list; kvquant is one of ours.
FROM_BASE_OR_OURS = {"torch", "triton", "kvquant", "adrkit"}


def _lines(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def _declared() -> dict[str, Requirement]:
    """Every third-party requirement of the packages (and kvbench's extras) and of the flows."""
    found: list[str] = []
    for name in PACKAGES:
        pyproject = ROOT / "packages" / name / "pyproject.toml"
        project = tomllib.loads(pyproject.read_text())["project"]
        found += project["dependencies"]
        if name == "bench":
            for extra in BENCH_EXTRAS:
                found += project["optional-dependencies"][extra]
    found += tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["flows"]
    requirements = {canonicalize_name(Requirement(r).name): Requirement(r) for r in found}
    return {k: v for k, v in requirements.items() if k not in FROM_BASE_OR_OURS}


def _model_and_data_pins() -> list[str]:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "MODEL_AND_DATA" for t in node.targets
        ):
            pins: list[str] = ast.literal_eval(node.value)
            return pins
    raise AssertionError("noxfile.py has no MODEL_AND_DATA")


def test_no_deps_list_has_every_package_and_the_nightly_model_and_data() -> None:
    listed = _lines(INFRA / "worker-packages.txt")
    assert [f"./packages/{name}" for name in PACKAGES] == listed[: len(PACKAGES)]
    assert listed[len(PACKAGES) :] == _model_and_data_pins()


def test_requirements_are_exactly_the_declared_third_party_dependencies() -> None:
    listed = {
        canonicalize_name(Requirement(line).name): Requirement(line)
        for line in _lines(INFRA / "worker-requirements.txt")
    }
    declared = _declared()
    assert sorted(set(declared) - set(listed)) == []  # missing: a stage would fail to import
    assert sorted(set(listed) - set(declared)) == []  # stale: nothing declares it any more
    assert not FROM_BASE_OR_OURS & set(listed)
    # A pinned dependency (Prefect: server and workers must agree) carries the same pin.
    for name, requirement in declared.items():
        if any(spec.operator == "==" for spec in requirement.specifier):
            assert listed[name].specifier == requirement.specifier, name


def test_worker_images_install_both_lists_with_the_base_torch_held() -> None:
    for dockerfile in sorted((INFRA / "docker").glob("*.Dockerfile")):
        text = dockerfile.read_text()
        assert "COPY infra/worker-packages.txt infra/worker-requirements.txt infra/" in text
        assert re.search(r"pip install --no-deps -r infra/worker-packages\.txt", text), dockerfile
        held = re.search(r"print\(f'torch==\{torch\.__version__\}'\)\" > (\S+)", text)
        constraint = re.search(
            r"pip install --constraint (\S+) -r infra/worker-requirements\.txt", text
        )
        assert held and constraint, dockerfile
        assert held.group(1) == constraint.group(1), dockerfile
