"""start_hosts_with="srun" against a real two-node Slurm on this machine (the session's ``slurm_cluster``
fixture): no mock of srun, salloc, squeue or scancel."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_the_test_cluster_runs_a_step_on_each_node(slurm_cluster):
    done = slurm_cluster.run(["srun", "-N2", "--ntasks-per-node=1", "printenv", "SLURMD_NODENAME"], timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["n1", "n2"]
    assert slurm_cluster.wait_no_jobs() == []
