"""Two "nodes" on this machine: two processes each calling notebook_launcher with its own node_rank."""

import socket
import subprocess
import sys
import textwrap

import pytest

from notebook_launcher import LaunchTimeoutError, notebook_launcher

NODE = textwrap.dedent("""
    import sys, torch
    from notebook_launcher import notebook_launcher, last_run

    def work():
        import torch.distributed as dist
        total = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(total)
        return dist.get_rank(), dist.get_world_size(), total.item()

    node, port = int(sys.argv[1]), sys.argv[2]
    notebook_launcher(work, num_processes=2, num_nodes=2, node_rank=node, master_addr="127.0.0.1", use_port=port,
                      device="cpu", timeout=90)
    print("ranks", sorted(last_run().results.values()))
""")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_nodes_with_static_rendezvous_make_one_group_of_four(tmp_path):
    script = tmp_path / "node.py"
    script.write_text(NODE)
    port = free_port()
    nodes = [subprocess.Popen([sys.executable, str(script), str(node), str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    try:
        outputs = [node.communicate(timeout=180)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
            node.wait()
    assert all(node.returncode == 0 for node in nodes), outputs
    assert "ranks [(0, 4, 6.0), (1, 4, 6.0)]" in outputs[0]  # global ranks node_rank * 2 + local rank
    assert "ranks [(2, 4, 6.0), (3, 4, 6.0)]" in outputs[1]
    assert "2 processes on node 1 of 2 (world size 4)" in outputs[1]


def test_a_node_that_never_arrives_is_a_clear_error_within_the_timeout():
    def work():
        return "never"

    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(work, num_processes=2, num_nodes=2, node_rank=0, master_addr="127.0.0.1",
                          use_port=str(free_port()), device="cpu", timeout=5)
    message = str(caught.value)
    assert message.startswith("The ranks of node 0 waited at the rendezvous (127.0.0.1:")
    assert "a node never joined" in message and "node_rank (0..1)" in message
