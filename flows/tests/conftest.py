"""Fixtures for the flow tests: a real Prefect server, and a small fork built with GitPython."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import git
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_START_TIMEOUT_S = 120


@dataclass(frozen=True)
class PrefectServer:
    api_url: str
    env: dict[str, str]

    def cli(self, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
        """Run the `prefect` CLI against this server from the repository root.

        In a process group of its own: past `timeout` the command and everything it started (a
        worker's flow-run processes) are killed, and the result says so after the output it
        printed, so a hang fails its test with what it did last instead of raising mid-test.
        """
        process = subprocess.Popen(
            ["prefect", *args],
            cwd=REPO_ROOT,
            env=self.env | env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            stderr += f"\n`prefect {' '.join(args[:3])}` did not end within {timeout:g} s: killed"
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def api(self, method: str, path: str, body: object | None = None) -> object:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(  # noqa: S310 - http on loopback only
            f"{self.api_url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
            return json.loads(response.read())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_prefect_server(
    home: Path, database_url: str, *, ui: bool = False
) -> Iterator[PrefectServer]:
    """A real `prefect server` on 127.0.0.1, with its UI if ``ui``; stopped with all its
    children, even on failure."""
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api_url,
        "PREFECT_API_DATABASE_CONNECTION_URL": database_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        # Workers poll often, so a test waits seconds, not the default 10 s, for a pickup.
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        # No runs from the deployments' cron schedules: a test that ran near the nightly's hour
        # would hand its worker a full nightly on embedded defaults instead of its own run.
        "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
        # The kernel build cache of these runs stays out of the user's ~/.cache.
        "KVQUANT_BUILD_CACHE": str(home / "kvquant-build-cache"),
    }
    with (home / "server.log").open("w") as log:
        server = subprocess.Popen(
            [
                *("prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)),
                *(() if ui else ("--no-ui",)),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + SERVER_START_TIMEOUT_S
            while True:
                try:
                    with urllib.request.urlopen(f"{api_url}/health", timeout=2):  # noqa: S310
                        break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        pytest.fail(f"prefect server did not become healthy; see {log.name}")
                    time.sleep(0.5)
            yield PrefectServer(api_url, env)
        finally:
            stop_process_group(server)


def stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """End a process started with start_new_session=True and every child it started."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """A real Prefect server with SQLite in a temporary PREFECT_HOME."""
    home = tmp_path_factory.mktemp("prefect-home")
    with running_prefect_server(home, f"sqlite+aiosqlite:///{home / 'prefect.db'}") as server:
        yield server


def create_pools(server: PrefectServer) -> None:
    """The three work pools flows/prefect.yaml deploys to."""
    for pool in ("cpu", "gfx90a", "cuda"):
        created = server.cli("work-pool", "create", pool, "--type", "process")
        assert created.returncode == 0, created.stdout + created.stderr


def deploy_all(server: PrefectServer) -> None:
    """Every deployment of flows/prefect.yaml, its schedules kept but none of their runs made."""
    deployed = server.cli("deploy", "--all", "--prefect-file", "flows/prefect.yaml", "--no-prompt")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    scheduled = server.api(
        "POST", "/flow_runs/filter", {"flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}}
    )
    assert scheduled == [], [run["name"] for run in scheduled]  # type: ignore[union-attr,index]


def start_worker(
    server: PrefectServer, pool: str, log: Path, **env: str
) -> subprocess.Popen[bytes]:
    """A `prefect worker` on `pool` in a process group of its own, its output in `log`."""
    with log.open("w") as out:
        return subprocess.Popen(
            ["prefect", "worker", "start", "--pool", pool, "--type", "process"],
            cwd=REPO_ROOT,
            env=server.env | env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _commit_tree(repo: git.Repo, files: dict[str, str], message: str) -> git.Commit:
    root = Path(repo.working_dir)
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    repo.index.add(list(files))
    return repo.index.commit(message)


UPSTREAM_FILES = {
    "README.md": "toy vllm\n",
    "vllm/__init__.py": "",
    "vllm/envs.py": 'environment_variables = {\n    "VLLM_TARGET_DEVICE": lambda: "cuda",\n}\n',
    "vllm/attention/backends/triton_attn.py": "SUPPORTED = ['auto', 'fp8']\n",
    "docs/index.md": "docs\n",
}


@dataclass(frozen=True)
class ForkFixture:
    fork: str
    upstream: str


@pytest.fixture(scope="session")
def small_fork(tmp_path_factory: pytest.TempPathFactory) -> ForkFixture:
    """An upstream repo tagged v1, and a vendor fork published as one squashed commit of v1
    plus a vendor patch to vllm/envs.py and the Triton attention backend."""
    base = tmp_path_factory.mktemp("fork-fixture")
    upstream = git.Repo.init(base / "upstream", initial_branch="main")
    _commit_tree(upstream, UPSTREAM_FILES, "upstream v1")
    upstream.create_tag("v1")
    fork = git.Repo.init(base / "fork", initial_branch="main")
    patched = UPSTREAM_FILES | {
        "vllm/envs.py": UPSTREAM_FILES["vllm/envs.py"].replace(
            "}\n", '    "VLLM_VENDOR_INT8_KV": lambda: "1",\n}\n'
        ),
        "vllm/attention/backends/triton_attn.py": "SUPPORTED = ['auto', 'fp8', 'int8']\n",
    }
    _commit_tree(fork, patched, "[Arch] Support bmz and nmz")
    return ForkFixture(fork=str(base / "fork"), upstream=f"git:{base / 'upstream'}@v1")


# One small kernel for one target: the kernels stage runs for real, in seconds. The full matrix
# is kvquant's build tests' and `nox -s kernels`' business.
TINY_KERNEL_MATRIX = """\
specs = "kvquant.ops:aot_specs"
[axes]
head_size = [64]
block_size = [16]
gqa = [1]
model_dtype = ["bf16"]
cache_dtype = ["int8"]
kernels = ["reduce_splits"]
num_warps = []
num_stages = []
[gates]
max_vgpr_spills = 0
"""


@pytest.fixture(scope="session")
def tiny_kernel_matrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kernels") / "matrix.toml"
    path.write_text(TINY_KERNEL_MATRIX)
    return path


# The accuracy stage on two ARC-Easy items, one pass each way, and the divergence with its two
# controls on two chunks of 64 tokens: the stage's plumbing, not a finding (kvbench's own tests
# and nightly measure accuracy).
TINY_ACCURACY_CONFIG = """\
[model]
path = ""
device = "cpu"
dtype = "auto"
max_length = 512

[compare]
baseline = "auto"
candidate = "int8"
prefill_reads_cache = true

[gate]
tolerance = 0.02
max_mean_kld = 0.005
min_same_top1 = 0.95
max_ppl_ratio = 1.01
path_agreement = 0.1

[[runs]]
mode = "single-pass"
tasks = ["kvb_arc_easy"]
limit = 2

[[runs]]
mode = "divergence"
corpus = "coqa-stories"
tokens = 128
chunk_length = 64
control_tokens = 64
"""


@pytest.fixture(scope="session")
def tiny_accuracy_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("accuracy") / "accuracy.toml"
    path.write_text(TINY_ACCURACY_CONFIG)
    return path


@pytest.fixture
def adr_copy(tmp_path: Path) -> Path:
    """A temporary copy of the project's docs/adr, so tests never touch the real ADRs; its
    sources.toml names the repository as the root the records' source hashes are of."""
    target = tmp_path / "adr"
    shutil.copytree(REPO_ROOT / "docs" / "adr", target)
    sources = target / "sources.toml"
    text = sources.read_text(encoding="utf-8")
    sources.write_text(text.replace('root = "../.."', f"root = {str(REPO_ROOT)!r}"), "utf-8")
    return target


def _postgres_bindir() -> Path:
    """The server binaries of the OS's PostgreSQL, installed from the OS packages if missing."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        for command in (["apt-get", "update"], ["apt-get", "install", "-y", "postgresql"]):
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            )
            if done.returncode != 0:
                pytest.fail(f"cannot install PostgreSQL: {' '.join(command)}: {done.stderr[-500:]}")
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A real PostgreSQL server on 127.0.0.1 in a temporary data directory, stopped at the end."""
    bindir = _postgres_bindir()
    # PostgreSQL refuses to run as root: as root, the server runs as the packages' postgres user.
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    base = Path(tempfile.mkdtemp(prefix="kvcache-pg-"))
    if as_user:
        shutil.chown(base, "postgres")
    data, port = base / "data", _free_port()

    def run(*command: str) -> None:
        done = subprocess.run([*as_user, *command], capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{command[0]}: {done.stdout[-800:]}{done.stderr[-800:]}"

    run(str(bindir / "initdb"), "-D", str(data), "-U", "prefect", "--auth=trust")
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1"
    run(
        str(bindir / "pg_ctl"),
        "-D",
        str(data),
        "-o",
        options,
        "-l",
        str(base / "log"),
        "-w",
        "start",
    )
    try:
        run(
            str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "prefect", "prefect"
        )
        yield f"postgresql+asyncpg://prefect@127.0.0.1:{port}/prefect"
    finally:
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(base, ignore_errors=True)


# A run of three or more English words; identifiers (with digits, `_`, `.`, `/`, `:`, `=` or
# `-`) and acronyms (KV, INT8, RECORD) are not words. Names of hardware and of models are names.
_ENGLISH_RUN = re.compile(
    r"(?<![\w./:=-])(?:[A-Za-z][a-z]+[ ,;()']+){2,}[A-Za-z][a-z]+(?![\w./:=-])"
)
_CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
_CODE = re.compile(r"(`+)(?:(?!\1).)+\1|<code>.*?</code>")
_BLOCK_BODY = re.compile(r"<!-- generated:(\S+) begin -->(.*?)<!-- generated:\1 end -->", re.DOTALL)


def prose(text: str) -> str:
    """TEXT without code (spans and elements) and line-break tags."""
    return _CODE.sub(" ", text).replace("<br>", " ")


def other_language(text: str, lang: str) -> list[str]:
    """The runs of ``text``'s prose that are in the other of the ADRs' two languages."""
    if lang == "zh":
        return _ENGLISH_RUN.findall(prose(text))
    return _CJK.findall(prose(text))


def generated_blocks(adr_text: str) -> dict[str, str]:
    """Block key -> generated body of an ADR's text."""
    return {m.group(1): m.group(2) for m in _BLOCK_BODY.finditer(adr_text)}
