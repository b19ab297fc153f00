"""benchmarks/bench_cold_tier.py runs end to end on small sizes and reports all three sections."""

import re
import subprocess
import sys
from pathlib import Path

from tests.support.redis_server import require_redis_server

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_cold_tier.py"


def test_bench_cold_tier_reports_ratios_hit_rate_and_log_cost():
    require_redis_server()
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--ids", "512", "--rounds", "2", "--universe", "4000",
         "--batches", "8", "--wal-pushes", "4", "--tracked", "50000"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert re.search(r"^pull .* \d\.\d\d$", out, re.MULTILINE), out
    assert re.search(r"^push .* \d\.\d\d$", out, re.MULTILINE), out
    assert re.search(r"^write .* \d\.\d\d$", out, re.MULTILINE), out
    (hit_rate,) = re.findall(r"^tiered .* (\d\.\d{3})$", out, re.MULTILINE)
    assert 0.0 < float(hit_rate) < 1.0  # a 10% tier on Zipf ids both hits and misses
    for mode in ("none", "interval", "always"):
        assert len(re.findall(rf"^{mode} +[14] ", out, re.MULTILINE)) == 2, out
    assert re.search(r"^50,000 +\d+\.\d\d +\d+\.\d\d$", out, re.MULTILINE), out
