"""Regenerate the Python gRPC code for proto/ into ember/v1/ (or --out DIR).

Usage: python scripts/gen_proto.py [--out DIR]

The generated modules are committed; tests/unit/test_generated_code.py fails
when they are stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

REPO = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO / "proto"
PROTO_FILES = ["ember/v1/parameter_server.proto"]


def generate(out_dir: Path) -> None:
    """Run protoc for every file in PROTO_FILES, writing modules under out_dir."""
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(PROTO_ROOT / f) for f in PROTO_FILES),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO, help="output root (default: repo)")
    generate(parser.parse_args().out)


if __name__ == "__main__":
    sys.exit(main())
