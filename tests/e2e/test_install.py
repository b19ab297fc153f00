"""Ember as users install it: the wheel, and the image's install steps, in a fresh virtual
environment outside the checkout (no editable install, no PYTHONPATH)."""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ember.kernels.loader import OPS

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
IMAGE_WORKDIR = "/opt/ember"
LOCAL_ONLY = (".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis")

# Run by the fresh environment's Python: one shard, a table, a pull and a push.
SERVE_PULL_PUSH = """
import sys, torch
import ember.ps_server.stores, ember.trainer.cache, ember.trainer.data, ember.trainer.models
from ember.ps_server.client import PSClient
from ember.ps_server.cluster import LocalCluster
from ember.ps_server.wire.table_spec import OptimizerKind, OptimizerSpec, TableSpec
from ember.kernels.loader import native_ops_available

assert native_ops_available()
with LocalCluster(1) as cluster, PSClient(cluster.endpoints) as client:
    client.create_table(TableSpec("t", dim=8, optimizer=OptimizerSpec(OptimizerKind.SGD, lr=0.5)))
    ids = torch.tensor([7, 3, 7])
    before = client.pull("t", ids)
    grads = torch.randn(3, 8)
    client.push("t", ids, grads)
    after = client.pull("t", ids)
    expected = before[1] - 0.5 * grads[1]
    assert torch.equal(before[0], before[2]) and before.abs().sum() > 0
    assert torch.allclose(after[1], expected, atol=1e-6), (after[1], expected)
    assert torch.allclose(after[0], before[0] - 0.5 * (grads[0] + grads[2]), atol=1e-6)
print("served", ember.ps_server.stores.__file__)
"""


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of each Dockerfile line, continuations joined."""
    joined = text.replace("\\\n", " ")
    instructions = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def _clean_env(venv: Path, kernel_cache: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("EMBER_", "PYTHON", "VIRTUAL_ENV", "PIP_NO_CACHE", "PIP_NO_COMPILE"))
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["EMBER_KERNELS_CACHE"] = str(kernel_cache)
    # pip skips byte-compiling every module it installs (~35 s for torch's alone on 2 cores):
    # the modules this test imports compile as they load. (The image still byte-compiles;
    # pip ignores a failure to. PIP_NO_COMPILE=1 would, oddly, compile.)
    env["PIP_COMPILE"] = "0"
    return env


def _run(command: list[str] | str, cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    result = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        shell=isinstance(command, str),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, (
        f"{command} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )
    return result.stdout


def run_image_steps(context: Path, env: dict[str, str]) -> list[str]:
    """Copy what the Dockerfile copies into ``context`` and run its install steps there."""
    ran = []
    for keyword, arguments in dockerfile_instructions(DOCKERFILE.read_text()):
        if keyword == "COPY":
            *sources, target = shlex.split(arguments)
            for source in sources:
                if (REPO / source).is_dir():
                    shutil.copytree(REPO / source, context / target, dirs_exist_ok=True)
                elif target.endswith("/"):
                    (context / target).mkdir(parents=True, exist_ok=True)
                    shutil.copy2(REPO / source, context / target / Path(source).name)
                else:
                    (context / target).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(REPO / source, context / target)
        elif keyword == "WORKDIR":
            assert arguments == IMAGE_WORKDIR
        elif keyword == "RUN" and arguments.startswith("apt-get"):
            continue  # system packages: this machine has g++ already
        elif keyword == "RUN":
            # The PyTorch CPU index is not reachable from CI; pip's own configuration here
            # finds the same CPU build of torch 2.13.0 on this machine's disk instead.
            _run(arguments, context, {**env, "TORCH_INDEX_URL": ""})
            ran.append(arguments)
    return ran


@pytest.mark.timeout(1500)
def test_wheel_and_image_steps_install_build_and_serve(tmp_path):
    venv, context, elsewhere = tmp_path / "venv", tmp_path / "image", tmp_path / "elsewhere"
    context.mkdir()
    elsewhere.mkdir()
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = _clean_env(venv, tmp_path / "kernel-cache")
    python = str(venv / "bin" / "python")

    # The image: its COPY set and its install commands (torch, the wheel, the native build).
    ran = run_image_steps(context, env)
    assert ran == [
        'TORCH_INDEX_URL="$TORCH_INDEX_URL" sh docker/install.sh torch',
        "sh docker/install.sh ember",
    ]

    # The wheel built from the checkout (a copy: a build leaves build/ in its source tree).
    source, dist = tmp_path / "source", tmp_path / "dist"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*LOCAL_ONLY))
    _run(
        [python, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dist), str(source)],
        elsewhere,
        env,
    )
    (wheel,) = dist.glob("ember_ps-*.whl")
    _run(
        [python, "-m", "pip", "install", "--force-reinstall", "--no-deps", str(wheel)],
        elsewhere,
        env,
    )

    native = {**env, "EMBER_KERNELS": "native"}
    doctor = _run([str(venv / "bin" / "ember"), "doctor"], elsewhere, native)
    assert doctor.count("CPU: native") == len(OPS), doctor
    served = _run([python, "-c", SERVE_PULL_PUSH], elsewhere, native, timeout=300)
    location = Path(served.split()[-1])
    assert venv in location.parents and REPO not in location.parents, location
