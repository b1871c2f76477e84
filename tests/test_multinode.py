"""Two "nodes" on this machine: two processes each calling notebook_launcher with its own node_rank."""

import socket
import subprocess
import sys
import textwrap

import pytest

from notebook_launcher import LaunchTimeoutError, last_run, notebook_launcher

pytestmark = pytest.mark.processes

NODE = textwrap.dedent("""
    import sys, torch
    from notebook_launcher import notebook_launcher, last_run

    def work():
        import torch.distributed as dist
        total = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(total)
        return dist.get_rank(), dist.get_world_size(), total.item()

    node, port, rdzv, launches = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    for _ in range(launches):  # one kernel may launch again and again
        if rdzv == "static":
            notebook_launcher(work, num_processes=2, num_nodes=2, node_rank=node, master_addr="127.0.0.1",
                              use_port=port, device="cpu", timeout=90)
        else:  # node ranks come from the rendezvous
            notebook_launcher(work, num_processes=2, num_nodes=2, rdzv_backend="c10d",
                              rdzv_endpoint=f"127.0.0.1:{port}", rdzv_id="two-nodes", device="cpu", timeout=90)
        print("ranks", sorted(last_run().results.values()), flush=True)
""")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _two_nodes(tmp_path, rdzv: str, launches: int = 1) -> list[str]:
    script = tmp_path / "node.py"
    script.write_text(NODE)
    port = free_port()
    nodes = [subprocess.Popen([sys.executable, str(script), str(node), str(port), rdzv, str(launches)],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    try:
        outputs = [node.communicate(timeout=180)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
            node.wait()
    assert all(node.returncode == 0 for node in nodes), outputs
    return outputs


def test_two_nodes_with_static_rendezvous_make_one_group_of_four(tmp_path):
    outputs = _two_nodes(tmp_path, "static")
    assert "ranks [(0, 4, 6.0), (1, 4, 6.0)]" in outputs[0]  # global ranks node_rank * 2 + local rank
    assert "ranks [(2, 4, 6.0), (3, 4, 6.0)]" in outputs[1]
    assert "2 processes on node 1 of 2 (world size 4)" in outputs[1]


def test_two_nodes_with_c10d_rendezvous_get_their_node_ranks_from_it_and_make_one_group_of_four(tmp_path):
    outputs = _two_nodes(tmp_path, "c10d")
    first = 0 if "ranks [(0, 4, 6.0), (1, 4, 6.0)]" in outputs[0] else 1  # whichever the rendezvous made node 0
    assert "ranks [(0, 4, 6.0), (1, 4, 6.0)]" in outputs[first], outputs
    assert "ranks [(2, 4, 6.0), (3, 4, 6.0)]" in outputs[1 - first], outputs
    assert "2 processes on node 1 of 2 (world size 4)" in outputs[1 - first]


def test_a_node_that_never_arrives_is_a_clear_error_within_the_timeout():
    def work():
        return "never"

    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(work, num_processes=2, num_nodes=2, node_rank=0, master_addr="127.0.0.1",
                          use_port=str(free_port()), device="cpu", timeout=5)
    message = str(caught.value)
    assert message.startswith("The ranks of node 0 waited at the rendezvous (127.0.0.1:")
    assert "a node never joined" in message and "node_rank (0..1)" in message


def test_a_node_that_never_arrives_at_the_c10d_rendezvous_is_a_clear_error_within_the_timeout():
    def work():
        return "never"

    endpoint = f"127.0.0.1:{free_port()}"
    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(work, num_processes=2, num_nodes=2, rdzv_backend="c10d", rdzv_endpoint=endpoint,
                          rdzv_id="alone", device="cpu", timeout=5)
    message = str(caught.value)
    assert message.startswith(f"This node waited at the c10d rendezvous {endpoint} (rdzv_id='alone') for all 2 "
                              "nodes and not all arrived within 5 s: a node never joined.")
    assert last_run().status == "timed out" and not last_run().results


def test_c10d_launches_can_follow_each_other_in_the_same_processes_with_the_same_rdzv_id(tmp_path):
    outputs = _two_nodes(tmp_path, "c10d", launches=3)
    ranks = [line for output in outputs for line in output.splitlines() if line.startswith("ranks ")]
    assert sorted(ranks) == ["ranks [(0, 4, 6.0), (1, 4, 6.0)]"] * 3 + ["ranks [(2, 4, 6.0), (3, 4, 6.0)]"] * 3


GARBAGE_STORE = textwrap.dedent("""
    import gc, socket
    import torch.distributed as dist
    from notebook_launcher import notebook_launcher

    class Holder:
        pass

    probe = socket.socket(); probe.bind(("127.0.0.1", 0)); port = probe.getsockname()[1]; probe.close()
    holder = Holder(); holder.store = dist.TCPStore("127.0.0.1", port, 1, True); holder.me = holder
    del holder  # a store server in a reference cycle: garbage that only the cyclic collector frees
    gc.disable()

    def collect():
        import gc
        gc.collect()  # in a forked rank: must not run the kernel's store destructor (it joins a thread not there)
        return "collected"

    print(notebook_launcher(collect, num_processes=2, device="cpu", timeout=30, display="text"))
""")


def test_a_rank_never_collects_the_kernels_garbage_such_as_a_c10d_store_server(tmp_path):
    script = tmp_path / "garbage.py"
    script.write_text(GARBAGE_STORE)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "collected", done.stdout + done.stderr
