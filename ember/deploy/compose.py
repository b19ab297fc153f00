"""The cluster file as a compose file: the same topology in containers.

``ember cluster compose --config F`` prints it; ``docker/compose.yaml`` is the
output for ``docker/cluster.toml`` (a test keeps the two in step).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from ember.deploy.cluster_file import ClusterSpec
from ember.deploy.topology import (
    REDIS_SERVICE,
    TRAINER_SERVICE,
    Placement,
    shard_config,
    shard_service,
    trainer_module_args,
)
from ember.settings import settings_argv

IMAGE = "ember-ps:latest"
SHARD_PORT = 50051
DURABLE_DIR = "/var/lib/ember"
DURABLE_VOLUME = "ember-durable"
REDIS_VOLUME = "ember-redis"
REDIS_IMAGE = "redis:7"
PROMETHEUS_IMAGE = "prom/prometheus:v2.53.0"
GRAFANA_IMAGE = "grafana/grafana:11.1.0"
GRAFANA_VOLUME = "ember-grafana"
SHARD_METRICS_PORT = 9400
TRAINER_METRICS_PORT = 9500
# Given on every shard's command line even at their defaults, so that no variable in the
# image's environment can move a shard.
_PLACED = ("shard", "num_shards", "host", "port")
# A shard reports NOT_SERVING while it rebuilds its rows from its log, which may take long:
# failures in the start period do not count, and its first success ends it.
_HEALTH = {"interval": "5s", "timeout": "5s", "retries": 20, "start_period": "600s"}


def compose_document(spec: ClusterSpec) -> dict[str, Any]:
    """The compose file of ``spec`` as a mapping."""
    spec.validate()
    placement = Placement(
        "0.0.0.0", SHARD_PORT, f"{REDIS_SERVICE}:6379", DURABLE_DIR, SHARD_METRICS_PORT,
        TRAINER_METRICS_PORT,
    )  # fmt: skip
    services: dict[str, Any] = {}
    if spec.redis is not None:
        services[REDIS_SERVICE] = {
            "image": REDIS_IMAGE,
            "command": [
                "redis-server",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
            ],
            "volumes": [f"{REDIS_VOLUME}:/data"],
            "healthcheck": {"test": ["CMD", "redis-cli", "ping"], **_HEALTH},
            "restart": "unless-stopped",
        }
    shard_names = []
    for k in range(spec.shards):
        name = shard_service(k)
        shard_names.append(name)
        # The restart policy supervises: a shard with a log that stops on a fault its restart
        # repairs exits, and compose starts it again (ember cluster up has no supervisor).
        config = shard_config(spec, k, placement)
        config = dataclasses.replace(config, exit_on_fault=bool(config.wal))
        service: dict[str, Any] = {
            **_built_image(),
            "command": ["ps", *settings_argv(config, always=_PLACED)],
            "volumes": [f"{DURABLE_VOLUME}:{DURABLE_DIR}"],
            "ports": [f"127.0.0.1:{SHARD_PORT + k}:{SHARD_PORT}"],
            "healthcheck": {
                "test": ["CMD", "python", "-m", "ember.cli.health_cmd", f"127.0.0.1:{SHARD_PORT}"],
                **_HEALTH,
            },
            "restart": "unless-stopped",
            "stop_signal": "SIGTERM",
            "stop_grace_period": "10s",
        }
        if spec.redis is not None:
            service["depends_on"] = {REDIS_SERVICE: {"condition": "service_healthy"}}
        services[name] = service
    if spec.trainer is not None:
        endpoints = [f"{name}:{SHARD_PORT}" for name in shard_names]
        services[TRAINER_SERVICE] = {
            **_built_image(),
            "entrypoint": ["python"],
            "command": trainer_module_args(spec, endpoints, placement),
            "volumes": [f"{DURABLE_VOLUME}:{DURABLE_DIR}"],
            "environment": {"OMP_NUM_THREADS": "1"},
            "depends_on": {name: {"condition": "service_healthy"} for name in shard_names},
            "restart": "no",
        }
    volumes = {DURABLE_VOLUME: {}} | ({REDIS_VOLUME: {}} if spec.redis is not None else {})
    if spec.metrics:
        services |= _monitoring_services()
        volumes[GRAFANA_VOLUME] = {}
    return {"services": services, "volumes": volumes}


def prometheus_config(spec: ClusterSpec) -> dict[str, Any]:
    """Prometheus's scrape config of ``spec``'s shards and trainer ranks."""
    shards = [f"{shard_service(k)}:{SHARD_METRICS_PORT}" for k in range(spec.shards)]
    ranks = spec.trainer.ranks if spec.trainer is not None else 0
    trainers = [f"{TRAINER_SERVICE}:{TRAINER_METRICS_PORT + r}" for r in range(ranks)]
    jobs = [{"job_name": "ember-shards", "static_configs": [{"targets": shards}]}]
    if trainers:
        jobs.append({"job_name": "ember-trainer", "static_configs": [{"targets": trainers}]})
    return {"global": {"scrape_interval": "5s"}, "scrape_configs": jobs}


def _monitoring_services() -> dict[str, Any]:
    """Prometheus and a provisioned Grafana, under the ``monitoring`` profile."""
    return {
        "prometheus": {
            "image": PROMETHEUS_IMAGE,
            "profiles": ["monitoring"],
            "volumes": ["./monitoring/prometheus.yml:/etc/prometheus/prometheus.yml:ro"],
            "ports": ["127.0.0.1:9090:9090"],
        },
        "grafana": {
            "image": GRAFANA_IMAGE,
            "profiles": ["monitoring"],
            "depends_on": ["prometheus"],
            "environment": {
                "GF_AUTH_ANONYMOUS_ENABLED": "true",
                "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
            },
            "volumes": [
                "./monitoring/grafana/provisioning:/etc/grafana/provisioning:ro",
                "./monitoring/grafana/dashboards:/var/lib/grafana/dashboards:ro",
                f"{GRAFANA_VOLUME}:/var/lib/grafana",
            ],
            "ports": ["127.0.0.1:3000:3000"],
        },
    }


def rendered_files(spec: ClusterSpec, config_name: str) -> dict[str, str]:
    """The files of ``spec``'s compose deployment by path relative to its directory:
    ``compose.yaml`` and, with metrics, ``monitoring/prometheus.yml``."""
    header = (
        f"# Generated by `ember cluster compose --config {config_name}`: edit that file, not this\n"
        "# one. Run from the repository root:\n"
        "#   docker compose -f docker/compose.yaml up --build\n"
        "#   docker compose -f docker/compose.yaml --profile monitoring up --build   # + dashboards\n"
        "# The trainer's run directory lands in the ember-durable volume under run/.\n"
    )
    files = {"compose.yaml": header + _yaml(compose_document(spec))}
    if spec.metrics:
        files["monitoring/prometheus.yml"] = (
            f"# Generated by `ember cluster compose --config {config_name}`.\n"
            + _yaml(prometheus_config(spec))
        )
    return files


def _yaml(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=False, width=100, default_flow_style=None)


def _built_image() -> dict[str, Any]:
    return {
        "build": {"context": "..", "dockerfile": "docker/Dockerfile"},
        "image": IMAGE,
    }
