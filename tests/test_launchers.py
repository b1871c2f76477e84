"""Every launch mechanism is one class behind ``launchers.base.Launcher``: the same ``launch`` arguments, and
``choose_launcher`` picks one per plan, so a new mechanism is a class and a line."""

from __future__ import annotations

import inspect

from notebook_launcher.launchers import HostSettings
from notebook_launcher.launchers.base import Launcher
from notebook_launcher.launchers.driver import choose_launcher
from notebook_launcher.launchers.hosts import HostsLauncher
from notebook_launcher.launchers.in_kernel import InKernelLauncher
from notebook_launcher.launchers.local import LocalLauncher
from notebook_launcher.launchers.slurm import SlurmLauncher
from notebook_launcher.plan import make_plan


def work():
    return 1


def test_every_mechanism_declares_the_launcher_interface_with_its_arguments():
    expected = inspect.signature(Launcher.launch)
    for mechanism in (LocalLauncher, HostsLauncher, SlurmLauncher, InKernelLauncher):
        assert Launcher in mechanism.__mro__  # declared, not just alike
        assert inspect.signature(mechanism.launch) == expected, mechanism


def test_choose_launcher_picks_one_mechanism_per_plan():
    hosts = ["127.0.0.1", "127.0.0.2"]
    across = make_plan(work, in_workers=True, num_processes=1, num_nodes=2, master_addr=hosts[0], device="cpu")
    assert type(choose_launcher(make_plan(work, num_processes=1, device="cpu"), None)) is InKernelLauncher
    assert type(choose_launcher(make_plan(work, num_processes=2, device="cpu"), None)) is LocalLauncher
    assert type(choose_launcher(across, HostSettings(hosts=hosts))) is HostsLauncher
    assert type(choose_launcher(across, HostSettings(hosts=hosts, start_with="srun"))) is SlurmLauncher
