"""The image's Dockerfile (the compose file is tested with the cluster file it comes from)."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"


def test_dockerfile_copies_only_existing_paths_and_pins_cpu_torch():
    text = DOCKERFILE.read_text()
    for source in re.findall(r"^COPY (\S+)", text, flags=re.MULTILINE):
        assert (REPO / source).exists(), f"Dockerfile copies missing {source}"
    assert "download.pytorch.org/whl/cpu" in text
    assert '"torch==2.13.0"' in (REPO / "docker" / "install.sh").read_text()
