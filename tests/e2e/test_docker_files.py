"""The container files describe a consistent cluster."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker" / "docker-compose.yml"
DOCKERFILE = REPO / "docker" / "Dockerfile"


def test_dockerfile_copies_only_existing_paths_and_pins_cpu_torch():
    text = DOCKERFILE.read_text()
    for source in re.findall(r"^COPY (\S+)", text, flags=re.MULTILINE):
        assert (REPO / source).exists(), f"Dockerfile copies missing {source}"
    assert "download.pytorch.org/whl/cpu" in text
    assert '"torch==2.13.0"' in (REPO / "docker" / "install.sh").read_text()


def test_compose_config_is_valid_and_shards_are_numbered():
    if shutil.which("docker-compose") is None:
        pytest.skip(
            "docker-compose is not installed (apt-get install docker-compose); compose file not validated"
        )
    result = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    shards = sorted(int(s) for s in re.findall(r"EMBER_SHARD: '(\d+)'", result.stdout))
    counts = set(re.findall(r"EMBER_NUM_SHARDS: '(\d+)'", result.stdout))
    assert counts == {str(len(shards))} and shards == list(range(len(shards)))
    # Every shard logs its writes to the volume that also holds the checkpoints.
    assert len(re.findall(r"EMBER_WAL: /var/lib/ember/wal", result.stdout)) == len(shards)
    assert result.stdout.count("ember-durable:/var/lib/ember") == len(shards)
