"""The committed generated code must match what protoc makes of proto/."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GENERATED = ["parameter_server_pb2.py", "parameter_server_pb2.pyi", "parameter_server_pb2_grpc.py"]


def test_generated_code_is_fresh(tmp_path):
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_proto.py"), "--out", str(tmp_path)], check=True
    )
    for name in GENERATED:
        fresh = (tmp_path / "ember" / "v1" / name).read_text()
        committed = (REPO / "ember" / "v1" / name).read_text()
        assert fresh == committed, f"ember/v1/{name} is stale: run python scripts/gen_proto.py"


def test_only_the_wire_module_imports_generated_code():
    importers = [
        path.relative_to(REPO)
        for folder in ("ps_server", "trainer", "kernels", "ember/cli")
        for path in (REPO / folder).rglob("*.py")
        if "parameter_server_pb2" in path.read_text()
    ]
    assert importers == [Path("ps_server/wire/messages.py")]
