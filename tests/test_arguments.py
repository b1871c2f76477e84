"""Bad input is refused in the kernel, before any process starts, with an error naming the parameter."""

import threading

import psutil
import pytest
import torch

from notebook_launcher import LaunchArgumentError, notebook_launcher
from notebook_launcher import plan as planning


def noop():
    return None


@pytest.fixture(autouse=True)
def no_process_may_start():
    yield
    assert psutil.Process().children(recursive=True) == []


@pytest.mark.parametrize("kwargs, error, words", [
    ({"num_processes": 0}, LaunchArgumentError, ["num_processes=0", "1 or more"]),
    ({"num_processes": -2}, LaunchArgumentError, ["num_processes=-2"]),
    ({"num_processes": 2.0}, TypeError, ["num_processes must be an int"]),
    ({"num_processes": "2"}, TypeError, ["num_processes must be an int"]),
    ({"num_processes": True}, TypeError, ["num_processes must be an int"]),
    ({"num_processes": 2, "node_rank": 2, "num_nodes": 2}, LaunchArgumentError, ["node_rank=2", "num_nodes - 1 = 1"]),
    ({"num_processes": 2, "mixed_precision": "fp32"}, LaunchArgumentError, ["mixed_precision='fp32'", "'bf16'"]),
    ({"num_processes": 2, "start_method": "forkserver"}, LaunchArgumentError, ["start_method='forkserver'"]),
    ({"num_processes": 2, "device": "tpu"}, LaunchArgumentError, ["device='tpu'", "'xla'"]),
    ({"num_processes": 2, "backend": "nccl2"}, LaunchArgumentError, ["backend='nccl2'"]),
    ({"num_processes": 2, "backend": "nccl", "device": "cpu"}, LaunchArgumentError, ["backend='nccl'", "gloo"]),
    ({"num_processes": 2, "use_port": "70000"}, LaunchArgumentError, ["use_port='70000'", "between 1 and 65535"]),
    ({"num_processes": 2, "use_port": "0"}, LaunchArgumentError, ["use_port='0'"]),
    ({"num_processes": 2, "use_port": "http"}, LaunchArgumentError, ["use_port='http'"]),
    ({"num_processes": 2, "timeout": 0}, LaunchArgumentError, ["timeout=0"]),
    ({"num_processes": 2, "timeout": "10"}, TypeError, ["timeout must be a number"]),
    ({"num_processes": 2, "max_restarts": -1}, LaunchArgumentError, ["max_restarts=-1"]),
    ({"num_processes": 2, "monitor_interval": 0}, LaunchArgumentError, ["monitor_interval=0"]),
    ({"num_processes": 2, "rdzv_endpoint": "nohostport"}, LaunchArgumentError, ["rdzv_endpoint='nohostport'"]),
    ({"num_processes": 2, "rdzv_conf": "x"}, TypeError, ["rdzv_conf must be a dict"]),
    ({"num_processes": 2, "num_nodes": 2, "rdzv_backend": "etcd"}, LaunchArgumentError, ["rdzv_backend='etcd'", "c10d"]),
])
@pytest.mark.processes
def test_bad_argument_names_the_parameter(kwargs, error, words):
    with pytest.raises(error) as caught:
        notebook_launcher(noop, **kwargs)
    for word in words:
        assert word in str(caught.value)


@pytest.mark.processes
def test_function_must_be_callable():
    with pytest.raises(TypeError, match="function must be callable"):
        notebook_launcher("train", num_processes=2)


@pytest.mark.parametrize("args", [5, "abc", {"lr": 1}])
@pytest.mark.processes
def test_args_must_be_a_tuple_or_list(args):
    with pytest.raises(TypeError, match=r"args must be a tuple or list .* args=\(value,\)"):
        notebook_launcher(noop, args=args, num_processes=2)


@pytest.mark.processes
def test_unpicklable_argument_under_spawn_is_named():
    def uses(lock):
        return lock

    with pytest.raises(TypeError) as caught:
        notebook_launcher(uses, args=(1, threading.Lock()), num_processes=2, start_method="spawn", device="cpu")
    message = str(caught.value)
    assert "args[1] (a lock) cannot be pickled for start_method='spawn'" in message
    assert "start_method='fork'" in message


@pytest.mark.processes
def test_unpicklable_global_of_the_function_under_spawn_is_named():
    lock = threading.Lock()

    def uses_global():
        return lock.locked()

    with pytest.raises(TypeError, match=r"function .*uses_global cannot be pickled .* it refers to `lock` \(a lock\)"):
        notebook_launcher(uses_global, num_processes=2, start_method="spawn", device="cpu")


@pytest.mark.processes
def test_more_gpu_ranks_than_gpus_with_fake_gpu_count(monkeypatch):
    monkeypatch.setattr(planning, "cuda_device_count", lambda: 1)
    with pytest.raises(LaunchArgumentError, match=r"num_processes=2 asks for more GPU ranks than the 1 CUDA GPU"):
        notebook_launcher(noop, num_processes=2, device="cuda")


def test_num_processes_none_is_two_ranks_on_cpu():
    assert planning.make_plan(noop, device="cpu").num_processes == 2
    assert planning.make_plan(noop, device="cpu", num_processes=None).world_size == 2


def test_num_processes_none_is_one_rank_per_gpu_with_fake_gpu_count(monkeypatch):
    monkeypatch.setattr(planning, "cuda_device_count", lambda: 3)
    plan = planning.make_plan(noop, device="cuda")
    assert plan.num_processes == 3 and plan.backend == "nccl"


@pytest.mark.processes
def test_num_processes_none_on_cuda_without_a_gpu_with_fake_gpu_count_says_what_to_do(monkeypatch):
    monkeypatch.setattr(planning, "cuda_device_count", lambda: 0)
    with pytest.raises(LaunchArgumentError, match=r"num_processes=None on device='cuda' .* no CUDA GPU .*device='cpu'"):
        notebook_launcher(noop, device="cuda")


@pytest.mark.processes
def test_fork_refused_with_fake_cuda_already_initialized_names_the_culprit(monkeypatch):
    monkeypatch.setattr(planning, "cuda_device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setitem(__import__("sys").modules, "bitsandbytes", object())
    with pytest.raises(LaunchArgumentError) as caught:
        notebook_launcher(noop, num_processes=2, device="cuda", start_method="fork")
    message = str(caught.value)
    assert "CUDA is already initialized in this kernel (probably by `import bitsandbytes`)" in message
    assert "start_method='spawn'" in message


def test_auto_start_method_with_fake_cuda_already_initialized_chooses_spawn(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    method, reason = planning.choose_start_method("auto", "cuda")
    assert method == "spawn" and "CUDA is already initialized" in reason
    assert planning.choose_start_method("auto", "cpu") == ("fork", "safe here")


def test_auto_device_on_this_cpu_machine_is_cpu_and_keeps_cuda_uninitialized():
    assert planning.detect_device() in ("cpu", "cuda")
    assert not torch.cuda.is_initialized()


@pytest.mark.processes
def test_xla_without_torch_xla_says_how_to_get_it():
    with pytest.raises(LaunchArgumentError, match="device='xla' needs torch_xla"):
        notebook_launcher(noop, num_processes=2, device="xla")
