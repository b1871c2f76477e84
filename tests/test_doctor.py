"""The doctor's checks, the environment report and set_seed, on real tools where this machine has them."""

import shutil
import socket
import subprocess
import sys

import pytest
import torch

from notebook_launcher import doctor, env_report, last_run, notebook_launcher, same_effective_batch, set_seed
from notebook_launcher.doctor import (
    OK,
    PROBLEM,
    WARNING,
    check_gpus,
    check_kernel_release,
    check_reproducibility,
    check_ssh,
)


@pytest.mark.parametrize("release, verdict", [
    ("5.4.0-generic", WARNING), ("4.19.0-25-amd64", WARNING), ("6.1.0", OK), ("5.5.0", OK),
    ("6.18.44-fc-v669", OK), ("weird", WARNING), ("", WARNING), ("5", WARNING),
])
def test_kernel_release_check(release, verdict):
    check = check_kernel_release(release)
    assert check.verdict == verdict
    if verdict == WARNING and release.startswith(("5.4", "4.")):
        assert "older than 5.5" in check.found and "upgrade" in check.fix


@pytest.mark.processes
def test_cuda_initialized_in_the_kernel_with_a_fake_cuda_query(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setitem(sys.modules, "bitsandbytes", object())
    check = doctor(kernel_release="6.1.0")["CUDA in this kernel"]
    assert check.verdict == PROBLEM and "`import bitsandbytes`" in check.found
    assert "start_method='spawn'" in check.fix


def test_gpu_heterogeneity_with_injected_device_tables():
    gpus = [{"name": "A100", "memory_bytes": 80 * 2**30, "capability": "8.0", "multiprocessors": 108},
            {"name": "T4", "memory_bytes": 16 * 2**30, "capability": "7.5", "multiprocessors": 40}]
    check = check_gpus(2, gpus)
    assert check.verdict == WARNING
    assert "bounded by T4 (16 GiB)" in check.found and "waits for T4" in check.found
    assert check_gpus(3, gpus).verdict == PROBLEM and "num_processes=2" in check_gpus(3, gpus).fix
    assert check_gpus(2, gpus[:1] * 2).verdict == OK
    assert check_gpus(None, []).verdict == OK


@pytest.mark.processes
def test_the_report_lists_every_check_and_the_env_report_its_fields():
    report = doctor(num_processes=2)
    names = [check.name for check in report.checks if not check.name.startswith(("Slurm", "srun"))]  # test_slurm
    assert names == ["Linux kernel", "CUDA in this kernel", "GPUs", "port", "/dev/shm", "open files", "MPI",
                     "reproducibility", "detached runs"]
    assert all(check.verdict in (OK, WARNING, PROBLEM) for check in report.checks)
    text = env_report()
    for field in ("notebook_launcher:", "Python:", "torch:", "accelerate:", "OS:", "NVIDIA driver:", "GPUs:",
                  "MPI:", "Environment:", "Accelerate config:"):
        assert field in text


@pytest.mark.processes
def test_command_line_doctor_and_env():
    completed = subprocess.run([sys.executable, "-m", "notebook_launcher", "doctor", "-n", "2"],
                               capture_output=True, text=True, timeout=120)
    assert "Linux kernel" in completed.stdout and completed.returncode in (0, 1)
    completed = subprocess.run([sys.executable, "-m", "notebook_launcher", "env"], capture_output=True, text=True,
                               timeout=120)
    assert completed.returncode == 0 and "torch:" in completed.stdout


@pytest.mark.processes
def test_real_mpi_sanity_run_with_a_localhost_hostfile(tmp_path):
    assert shutil.which("mpirun"), "Open MPI is missing: .ci/run installs openmpi-bin"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n")
    report = doctor(hostfile=str(hostfile), ssh_options=["-o", "ConnectTimeout=1", "-p", "1"])
    check = report["mpirun sanity run"]
    assert check.verdict == OK, check
    assert check.found.startswith("Open MPI: 1 host name(s) printed: " + socket.gethostname())
    assert report["MPI"].found.startswith("Open MPI at ")


def test_ssh_check_against_a_real_local_sshd(local_sshd):
    reachable = check_ssh("127.0.0.1", local_sshd)
    assert reachable.verdict == OK and reachable.found == "reachable without a password"
    no_key = check_ssh("127.0.0.1", [opt for opt in local_sshd if opt != "-i"][:2] + ["-i", "/nonexistent"])
    assert no_key.verdict == PROBLEM and "ssh-copy-id" in no_key.fix
    unreachable = check_ssh("127.0.0.2", ["-p", "1"])
    assert unreachable.verdict == PROBLEM


def seeded_draws(seed):
    import random

    set_seed(seed)
    return [random.random(), float(torch.rand(1)), __import__("numpy").random.rand()]


@pytest.mark.processes
def test_set_seed_gives_identical_results_across_two_launches():
    first = notebook_launcher(seeded_draws, args=(7,), num_processes=2, device="cpu")
    second = notebook_launcher(seeded_draws, args=(7,), num_processes=2, device="cpu")
    assert first == second and last_run().results[0] == last_run().results[1]
    assert notebook_launcher(seeded_draws, args=(8,), num_processes=2, device="cpu") != first


@pytest.mark.processes
def test_same_effective_batch_and_the_reproducibility_check(monkeypatch):
    assert same_effective_batch(32, 2, 1e-3, 4) == {"per_device_batch": 16, "learning_rate": 1e-3,
                                                    "effective_batch": 64, "exact": True}
    uneven = same_effective_batch(32, 2, 1e-3, 3)
    assert uneven["per_device_batch"] == 21 and not uneven["exact"]
    assert uneven["learning_rate"] == pytest.approx(1e-3 * 63 / 64)

    from notebook_launcher import find_executable_batch_size

    def train(start):
        @find_executable_batch_size(starting_batch_size=start)
        def inner(batch_size):
            return batch_size

        return inner()

    notebook_launcher(train, args=(32,), num_processes=2, device="cpu")
    notebook_launcher(train, args=(16,), num_processes=2, device="cpu")
    check = check_reproducibility()
    assert check.verdict == WARNING and "effective batch size changed: 64" in check.found and "-> 32" in check.found


@pytest.mark.processes
def test_an_old_kernel_is_warned_about_once_at_launch(monkeypatch, capsys):
    import platform

    from notebook_launcher.launchers import driver

    monkeypatch.setattr(driver, "_kernel_checked", False)
    monkeypatch.setattr(platform, "release", lambda: "5.4.0-generic")
    notebook_launcher(lambda: None, num_processes=2, device="cpu")
    notebook_launcher(lambda: None, num_processes=2, device="cpu")
    out = capsys.readouterr().out
    assert out.count("warning: Linux kernel 5.4.0-generic: older than 5.5") == 1
