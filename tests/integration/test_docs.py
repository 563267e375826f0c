"""Every page of README.md and docs/ runs exactly as printed, with no hidden set-up.

A page is run as a reader would run it, top to bottom, from a checkout of the project:

* its set-up command, the first ```sh block that starts ``smartnsq cluster``, is started as
  printed (the cluster on the documented fixed ports, e.g. ``--lookupd-port 4161``) and
  stopped with Ctrl-C (SIGINT) once the page is done; it must exit 0. A page starts only once
  its ports are free, and is over only once its cluster has exited and freed every port it
  listened on, so the next page never finds them taken (a cluster that does not stop on
  Ctrl-C is killed, and the page fails). Fixed ports are shared by every checkout on the
  machine: run this file under ``flock /tmp/smartnsq-port4161.lock``;
* every other ```sh block runs as printed (bash, ``set -euo pipefail``) from the root of the
  checkout (where docker-compose.yml is), and must exit 0;
* every ```python block runs as a program, and every ```python pytest block as a test module
  under pytest (with the project's ``nsq_cluster`` plugin), in an empty directory, and must
  pass.

```console blocks are shown, not run (installing, or commands for machines other than this
one). The README's "Set up on a fresh machine" commands are what CI itself runs.
Pages with Docker examples need an engine: skipped without one, unless
``$SMARTNSQ_REQUIRE_DOCKER`` is set (CI), which makes them run.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

import smartnsq

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(python pytest|python|sh)\n(.*?)^```", re.MULTILINE | re.DOTALL)
FRESH_MACHINE = "## Set up on a fresh machine"
STEP_TIMEOUT = 180.0
# How long a page waits for a fixed port to be free (the previous page's, or another run's).
PORT_TIMEOUT = 30.0
ADDRESS = re.compile(rb"127\.0\.0\.1:(\d+)")
# A block that starts a Spark session (10-20 s, and its first job starts Python workers).
SPARK_STEP_TIMEOUT = 300.0


class Block(NamedTuple):
    where: str
    kind: str  # "sh", "python" or "python pytest"
    code: str


class Page(NamedTuple):
    path: Path
    setup: Block | None
    blocks: list[Block]

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT))

    @property
    def uses_spark(self) -> bool:
        return any("pyspark" in b.code for b in self.blocks)

    @property
    def needs_docker(self) -> bool:
        return any("docker" in b.code or "ContainerCluster" in b.code for b in self.blocks)


def _page(path: Path) -> Page:
    text = path.read_text()
    if path.name == "README.md":
        # what CI runs on a fresh machine, not part of the walk-through
        head, _, rest = text.partition(FRESH_MACHINE)
        text = head + "\n" + rest.split("\n## ", 1)[1] if rest else head
    blocks = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(f"{path.relative_to(ROOT)}:{line}", match.group(1), match.group(2)))
    setup = next(
        (b for b in blocks if b.kind == "sh" and b.code.startswith("smartnsq cluster ")), None
    )
    return Page(path, setup, [b for b in blocks if b is not setup])


PAGES = [
    page
    for page in map(_page, [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])
    if page.blocks
]


def test_pages_were_found() -> None:
    blocks = [b for page in PAGES for b in page.blocks]
    assert len(blocks) >= 20
    assert {b.kind for b in blocks} == {"sh", "python", "python pytest"}


def _env() -> dict[str, str]:
    """The reader's environment: none of the developer's SMARTNSQ_* settings, the project's
    ``smartnsq`` and ``python`` first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMARTNSQ_")}
    if "SMARTNSQ_TEST_IMAGE" in os.environ:  # CI's smartnsq image, for the Docker page
        env["SMARTNSQ_TEST_IMAGE"] = os.environ["SMARTNSQ_TEST_IMAGE"]
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


async def _run(command: list[str], cwd: Path, where: str, timeout: float) -> None:
    process = await asyncio.create_subprocess_exec(
        *command,
        cwd=cwd,
        env=_env(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, f"{where} failed ({process.returncode}):\n{out.decode()}"


class Started(NamedTuple):
    process: asyncio.subprocess.Process
    ports: set[int]  # every port the cluster said it listens on


def _port_free(port: int) -> bool:
    """Whether a server could listen on the port now (bound as the cluster binds it)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def _until_free(ports: set[int], where: str, timeout: float = PORT_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while busy := sorted(p for p in ports if not _port_free(p)):
        if time.monotonic() > deadline:
            pytest.fail(
                f"{where}: port {', '.join(map(str, busy))} still in use after {timeout} s "
                "(another docs run? run them under flock /tmp/smartnsq-port4161.lock)"
            )
        await asyncio.sleep(0.05)


def _fixed_ports(setup: Block) -> set[int]:
    found = re.search(r"--lookupd-port[ =](\d+)", setup.code)
    return {int(found.group(1))} if found else set()


async def _start(setup: Block, cwd: Path) -> Started:
    """The page's cluster, started as printed once its port is free; returns once it has
    printed its addresses. A cluster that does not get that far is killed."""
    await _until_free(_fixed_ports(setup), setup.where)
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        f"exec {setup.code.strip()}",
        cwd=cwd,
        env=_env(),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    seen: list[bytes] = []
    try:
        while True:
            line = await asyncio.wait_for(process.stdout.readline(), 60)
            seen.append(line)
            if not line:
                pytest.fail(f"{setup.where}: the set-up command ended:\n{b''.join(seen).decode()}")
            if line.startswith(b"Ready"):
                ports = {int(port) for port in ADDRESS.findall(b"".join(seen))}
                return Started(process, ports)
    except BaseException:
        if process.returncode is None:
            process.kill()
            await process.wait()
        raise


async def _stop(started: Started, setup: Block) -> None:
    """Ctrl-C, as a reader stops it; over once the process has exited and its ports are
    free again (killed if Ctrl-C does not stop it: the page then fails)."""
    process = started.process
    if process.returncode is None:
        process.send_signal(signal.SIGINT)  # Ctrl-C
    assert process.stdout is not None
    try:
        out = await asyncio.wait_for(process.stdout.read(), 30)
        code = await asyncio.wait_for(process.wait(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    await _until_free(started.ports, setup.where)
    assert code == 0, f"{setup.where}: the cluster exited {code}:\n{out.decode()}"


def _page_params() -> list[object]:
    """Pages with Spark examples carry the spark marker."""
    return [
        pytest.param(page, id=page.name, marks=[pytest.mark.spark] if page.uses_spark else [])
        for page in PAGES
    ]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", _page_params())
async def test_page_runs_as_printed(page: Page, tmp_path: Path) -> None:
    if page.needs_docker:
        _require_docker()
    cluster = await _start(page.setup, ROOT) if page.setup is not None else None
    try:
        for number, block in enumerate(page.blocks):
            cwd = tmp_path
            if block.kind == "sh":
                command = ["bash", "-c", "set -euo pipefail\n" + block.code]
                cwd = ROOT
            else:
                script = tmp_path / f"test_example_{number}.py"
                script.write_text(block.code)
                command = [sys.executable, str(script)]
                if block.kind == "python pytest":
                    command[1:1] = ["-m", "pytest", "-q", "-p", "no:cacheprovider"]
            timeout = SPARK_STEP_TIMEOUT if "pyspark" in block.code else STEP_TIMEOUT
            await _run(command, cwd, block.where, timeout)
    finally:
        if page.needs_docker:
            await _tear_down_compose(page)
        if cluster is not None:
            await _stop(cluster, page.setup)  # type: ignore[arg-type]


async def _tear_down_compose(page: Page) -> None:
    """A page that failed half-way leaves no containers: its own ``down`` commands run
    again (harmless when they already ran)."""
    for block in page.blocks:
        if block.kind == "sh" and " down" in block.code:
            process = await asyncio.create_subprocess_exec(
                "bash",
                "-c",
                block.code,
                cwd=ROOT,
                env=_env(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await asyncio.wait_for(process.wait(), 120)


def _require_docker() -> None:
    from smartnsq.testing.containers import docker_unavailable_reason

    reason = docker_unavailable_reason()
    if reason is not None:
        if os.environ.get("SMARTNSQ_REQUIRE_DOCKER"):
            pytest.fail(f"$SMARTNSQ_REQUIRE_DOCKER is set, but {reason}")
        pytest.skip(reason)


async def test_a_page_waits_for_its_ports_and_says_who_to_blame() -> None:
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    asyncio.get_running_loop().call_later(0.2, holder.close)
    await _until_free({port}, "page.md:1")  # freed meanwhile: the page goes on
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    try:
        with pytest.raises(pytest.fail.Exception, match=f"port {port} still in use .* flock"):
            await _until_free({port}, "page.md:1", timeout=0.2)
    finally:
        holder.close()


def test_the_fixed_ports_of_a_page() -> None:
    setup = Block("page.md:1", "sh", "smartnsq cluster --lookupd-port 4161 --nodes 2\n")
    assert _fixed_ports(setup) == {4161}
    assert _fixed_ports(Block("page.md:1", "sh", "smartnsq cluster --classic\n")) == set()


# A consuming example on its page's shared cluster reads a topic that no other example of the
# page publishes to: it then reads what it publishes itself, whichever examples ran before it
# (a reader may run one example alone, skip one, or run one again). A page that shares a topic
# on purpose says why, on the page and here.
SHARED_ON_PURPOSE = {
    ("docs/quickstart.md", "orders"): "its consumer shows a channel handing over what waited",
}
_CONSUMES = re.compile(r'Consumer\(\s*"([^"]+)"')
_PUBLISHES = re.compile(r'publish(?:_many)?\(\s*"([^"]+)"')
_LOCAL_PORT = re.compile(r"127\.0\.0\.1:(\d+)")


def test_examples_sharing_a_cluster_read_only_what_they_publish() -> None:
    problems = []
    for page in PAGES:
        if page.setup is None:
            continue
        ports = _fixed_ports(page.setup)
        on_cluster = [
            block
            for block in page.blocks
            if block.kind != "sh" and {int(p) for p in _LOCAL_PORT.findall(block.code)} & ports
        ]
        for block in on_cluster:
            for topic in sorted(set(_CONSUMES.findall(block.code))):
                others = [
                    other.where
                    for other in on_cluster
                    if other is not block and topic in _PUBLISHES.findall(other.code)
                ]
                if others and (page.name, topic) not in SHARED_ON_PURPOSE:
                    problems.append(f"{block.where} consumes {topic!r}, published by {others}")
    assert not problems


def test_reference_names_every_public_name() -> None:
    reference = (ROOT / "docs" / "reference.md").read_text()
    missing = [name for name in smartnsq.__all__ if name != "__version__" and name not in reference]
    assert missing == []


def _named_modules(text: str) -> set[str]:
    return {
        n.removeprefix("smartnsq/") for n in re.findall(r"\b((?:[a-z_]+/)*[a-z_]+\.py)\b", text)
    }


def test_architecture_names_every_module() -> None:
    """... and every module of the package is on it (the CLI's subcommands as ``cli/``)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = _named_modules(text)
    package = ROOT / "smartnsq"
    unnamed = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if path.name in ("__init__.py", "__main__.py", "_version.py"):
            continue
        folder = relative.split("/")[0] if "/" in relative else ""
        if folder == "cli":
            continue
        short = relative.split("/", 1)[1] if folder in ("protocol", "testing") else relative
        if relative not in named and short not in named:
            unnamed.append(relative)
    assert unnamed == []


def test_architecture_names_existing_modules() -> None:
    """The architecture page matches the code: every module it names exists."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    named = _named_modules(text)
    package = ROOT / "smartnsq"
    missing = [
        name
        for name in named
        if not (package / name).exists()
        and not (package / "protocol" / name).exists()
        and not (package / "testing" / name).exists()
    ]
    assert missing == []


# Pages whose examples are held to mypy as a user's own code would be (default settings,
# untyped test functions checked too): the embedded cluster's, whose leader() is None
# during a failover (issue 34: the faults guide indexed the proxies with it unchecked).
TYPED_PAGES = (
    "docs/guides/faults.md",
    "docs/guides/durable-channels.md",
    "docs/guides/failures.md",
)


@pytest.mark.slow
def test_the_cluster_examples_type_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # mypy comes with the dev extra (.ci/run); the test extra (the Python 3.13 leg) has none.
    api = pytest.importorskip("mypy.api", reason="mypy is in the dev extra, not in test")
    files = []
    for page in PAGES:
        if page.name in TYPED_PAGES:
            for number, block in enumerate(page.blocks):
                if block.kind != "sh":
                    path = tmp_path / f"{page.path.stem.replace('-', '_')}_{number}.py"
                    path.write_text(block.code)
                    files.append(str(path))
    assert len(files) >= 3
    # The checkout, as a user's mypy finds the package (no --ignore-missing-imports: an
    # unresolved smartnsq is an error, never a silent Any); smartnsq's own modules are the
    # project's mypy run's to check.
    monkeypatch.setenv("MYPYPATH", str(ROOT))
    defaults = tmp_path / "mypy.ini"  # not the project's strict settings
    defaults.write_text("[mypy]\n")
    out, err, status = api.run(
        [
            f"--config-file={defaults}",
            "--python-version=3.11",
            "--check-untyped-defs",
            "--follow-imports=silent",
            "--no-error-summary",
            f"--cache-dir={tmp_path / 'cache'}",
            *files,
        ]
    )
    assert status == 0, out + err
