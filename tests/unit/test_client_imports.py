"""The client side loads no shard-side module: a trainer imports only what it runs."""

from __future__ import annotations

import json
import subprocess
import sys

SHARD_SIDE = ("ember.ps_server.shard", "ember.ps_server.stores", "ember.ps_server.durability")


def _modules_loaded_by(statement: str) -> list[str]:
    """Names of ``ember.*`` modules a fresh interpreter holds after ``statement``."""
    program = (
        f"import json, sys\n{statement}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('ember'))))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    return json.loads(completed.stdout.splitlines()[-1])


def _shard_side(modules: list[str]) -> list[str]:
    return [m for m in modules if m.startswith(SHARD_SIDE)]


def test_the_client_loads_no_shard_store_log_or_checkpoint_module() -> None:
    loaded = _modules_loaded_by(
        "from ember.ps_server.client import PSClient, StepClient, StepJob, ClientConfig"
    )
    assert "ember.ps_server.client.ps_client" in loaded
    assert _shard_side(loaded) == []


def test_the_trainer_loads_no_shard_side_module() -> None:
    loaded = _modules_loaded_by("import ember.trainer.train")
    assert "ember.ps_server.client.step_client" in loaded
    assert _shard_side(loaded) == []


def test_the_check_sees_shard_side_modules() -> None:
    """The prefixes name real packages: the shard's entry point loads all three sides."""
    loaded = _shard_side(_modules_loaded_by("import ember.ps_server.shard.shard_server"))
    assert {m.rsplit(".", 1)[0] for m in loaded if m.count(".") == 3} >= set(SHARD_SIDE)


def test_the_container_health_probe_loads_neither_torch_nor_the_cli() -> None:
    program = (
        "import sys, ember.cli.health_cmd\n"
        "print(sorted(m for m in ('torch', 'ember.cli.main', 'ember.ps_server.client') "
        "if m in sys.modules))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip() == "[]"
