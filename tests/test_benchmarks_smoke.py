"""Every benchmark in benchmarks/ runs at a tiny size (``--smoke``: one repetition, the smallest sizes) to its end
and reports its headline ratios, so that the benchmarks keep running as the code under them changes. Not a
measurement: the figures are only checked to be numbers."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest
from helpers.processes import no_children_left, run_in_session
from helpers.slurm_cluster import slurm_missing

BENCHMARKS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
# What each starts besides workers (in its own process, so marked here by hand: the audit hook sees one script)
COSTS = {
    "collective_hooks": [],
    "ddp_hook_overhead": [],
    "debug_overhead": [],
    "detached_launch": [],
    "functional_hooks": [],
    "hang_notice": [],
    "hosts_launch": [pytest.mark.sshd],
    "launch_overhead": [],
    "logging_stages": [],
    "logging_throughput": [pytest.mark.kernel],
    "oom_retry": [],
    "panel_browser": [pytest.mark.kernel, pytest.mark.browser],
    "panel_overhead": [pytest.mark.kernel],
    "result_transfer": [],
    "rich_output_throughput": [pytest.mark.kernel],
    "slurm_launch": [pytest.mark.sshd, pytest.mark.slurm],
}
SMOKE_S = 300  # a smoke run takes 5-40 s here; this machine is shared


def test_every_benchmark_has_a_smoke_run():
    scripts = {name[:-3] for name in os.listdir(BENCHMARKS_DIR) if name.endswith(".py")} - {"common", "run"}
    assert scripts == set(COSTS)


@pytest.mark.processes
@pytest.mark.parametrize("name", [pytest.param(name, marks=marks) for name, marks in COSTS.items()])
def test_the_benchmark_runs_at_a_tiny_size_and_reports_its_ratios(name, tmp_path):
    if name == "slurm_launch" and slurm_missing():
        pytest.skip(slurm_missing())
    output = tmp_path / f"{name}.json"
    done = run_in_session([sys.executable, os.path.join(BENCHMARKS_DIR, f"{name}.py"), "--smoke", "--output",
                           str(output)], SMOKE_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    headline = json.loads(output.read_text())["headline"]
    figures = [value for value in headline.values() if value is not None]
    assert figures and all(math.isfinite(value) and value > 0 for value in figures), headline
    assert "headline: " in done.stdout
    no_children_left()
