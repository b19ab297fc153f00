"""pyproject.toml ships every package and every kernel source, and states one Python."""

import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _installed_packages() -> set[str]:
    """Every folder with an __init__.py under the mapped roots, as its import name."""
    found = set()
    for package, folder in SETUPTOOLS["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((package, *relative)))
    return found


def test_every_package_folder_is_listed():
    assert set(SETUPTOOLS["packages"]) == _installed_packages()


def test_every_kernel_source_is_package_data():
    patterns = SETUPTOOLS["package-data"]["ember.kernels"]
    kernel_root = REPO / SETUPTOOLS["package-dir"]["ember.kernels"]
    shipped = {path for pattern in patterns for path in kernel_root.glob(pattern)}
    sources = {p for p in kernel_root.rglob("*") if p.suffix in (".cpp", ".h", ".cu", ".cuh")}
    assert sources and sources == shipped


def test_readme_setup_and_pyproject_state_the_same_python_and_it_is_the_one_tested():
    minimum = re.fullmatch(r">=(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    major, minor = int(minimum.group(1)), int(minimum.group(2))
    readme = (REPO / "README.md").read_text()
    assert f"Python {major}.{minor} or newer" in readme
    assert not re.search(r"Python 3\.\d+\+", readme)
    setup = (REPO / "scripts" / "setup-venv.sh").read_text()
    assert f"sys.version_info < ({major}, {minor})" in setup
    # CI runs the suite on the oldest Python the package accepts (setup-venv.sh's python3).
    assert sys.version_info[:2] >= (major, minor)
    assert f"FROM python:{major}.{minor}-" in (REPO / "docker" / "Dockerfile").read_text()
