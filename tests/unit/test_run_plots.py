"""ember report: plots and a summary from a run directory; bad run directories named."""

import json

import pytest
from ember.trainer.run_plots import RunDirectoryError, read_run, render_plots, write_summary
from ember.trainer.telemetry import PLOTS


def _snapshot(step: int) -> dict:
    return {
        "step": step, "elapsed_s": 0.1 * step, "loss": 0.7 - 0.01 * step,
        "samples_per_s": 1000.0 + step, "hit_rate": 0.9, "ps_wait_share": 0.3,
        "ps_wait_s": 0.03 * step, "overlapped_share": 0.5, "clock_lag": step % 2,
        "bytes_per_sample": {"pulled": 50.0, "pushed": 50.0, "hot_allreduce": 700.0, "control": 1.0},
    }  # fmt: skip


REPORT = {
    "world_size": 2, "steps": 5, "samples_per_s": 1005.0, "final_train_loss": 0.66,
    "heldout_auc": 0.73, "heldout_logloss": 0.58, "cache_hit_rate": 0.9, "wall_s": 0.5,
    "ps_wait_s": 0.15, "max_clock_lag": 1, "data_path": "pipeline", "transport": "grpc",
    **{f"bytes_{c}_per_sample": 10.0 for c in ("pulled", "pushed", "hot_allreduce", "control")},
}  # fmt: skip


@pytest.fixture
def run_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"steps": 5, "endpoints": ["a:1"]}))
    lines = [json.dumps(_snapshot(step)) for step in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "report.json").write_text(json.dumps(REPORT))
    return tmp_path


def test_every_plot_is_a_png_and_the_summary_names_them(run_dir):
    images = render_plots(run_dir)
    assert [p.stem for p in images] == list(PLOTS)
    for image in images:
        assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 10_000
    summary = write_summary(run_dir, images).read_text()
    assert "| held-out AUC | 0.7300 |" in summary and "| samples/s | 1,005 |" in summary
    assert all(f"]({name}.png)" in summary for name in PLOTS)
    assert '"steps": 5' in summary and "endpoints" not in summary


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "report.json").unlink(), "report.json: .*No such file"),
        (
            lambda d: (d / "metrics.jsonl").write_text('{"step": 1}\n{not json\n'),
            "metrics.jsonl line 2",
        ),
        (lambda d: (d / "metrics.jsonl").write_text(""), "no steps recorded"),
        (lambda d: (d / "config.json").write_text("["), "config.json"),
    ],
)
def test_a_damaged_run_directory_is_named_with_what_is_wrong(run_dir, damage, message):
    damage(run_dir)
    with pytest.raises(RunDirectoryError, match=message):
        read_run(run_dir)
