"""The launch keywords are declared once (``notebook_launcher/keywords.py``): the signature users see in help(),
the plan's defaults and the README's table are made from it, and a call is checked against it."""

import dataclasses
import inspect
import json
import os
import re
from dataclasses import fields

import pytest

from notebook_launcher import notebook_launcher
from notebook_launcher.keywords import LaunchKeywords, readme_table
from notebook_launcher.launch_plan import DECIDED_ON_EACH_HOST, LaunchPlan
from notebook_launcher.plan import make_plan, plan_on_agent
from notebook_launcher.xla_devices import XlaLayout

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def readme() -> str:
    with open(README) as file:
        return file.read()


def test_the_readme_shows_the_signature_as_it_is():
    shown = re.search(r"```python\nnotebook_launcher\((.*?)\)\n```", readme(), re.S).group(1)
    shown = " ".join(shown.split())
    parts, starred = [], False
    for name, parameter in inspect.signature(notebook_launcher).parameters.items():
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and not starred:
            parts.append("*")
            starred = True
        default = parameter.default
        parts.append(name if default is inspect.Parameter.empty else f"{name}={default!r}".replace("'", '"'))
    assert shown == ", ".join(parts)


def test_the_readme_table_is_the_declaration():
    shown = re.search(r"<!-- keywords table: begin -->\n(.*?)\n<!-- keywords table: end -->", readme(), re.S)
    assert shown is not None, "the README lost its table of keywords"
    assert shown.group(1) == readme_table(), "regenerate it: python scripts/keywords_table.py"


def test_accelerates_keywords_are_positional_in_accelerates_order_and_ours_keyword_only():
    parameters = list(inspect.signature(notebook_launcher).parameters.values())
    positional = [p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == ["function", "args", "num_processes", "mixed_precision", "use_port", "master_addr",
                          "node_rank", "num_nodes", "rdzv_backend", "rdzv_endpoint", "rdzv_conf", "rdzv_id",
                          "max_restarts", "monitor_interval", "log_line_prefix_template"]
    assert {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY} >= {"timeout", "debug", "hosts"}


@pytest.mark.processes
def test_a_positional_call_as_accelerate_users_write_it():
    # num_processes=1 by position: the function runs in this process, as with Accelerate's launcher
    assert notebook_launcher(lambda x: x * 2, (21,), 1) == 42


@pytest.mark.processes
def test_an_unknown_keyword_names_the_one_meant_before_anything_starts():
    with pytest.raises(TypeError, match=r"'num_process'.*did you mean num_processes="):
        notebook_launcher(print, num_process=2)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        make_plan(print, num_process=2)


def test_the_plan_defaults_are_the_declarations():
    default = make_plan(print, device="cpu", num_processes=2)
    declared = LaunchKeywords()
    assert default.hang_warning == declared.hang_warning and type(default.hang_warning) is float
    assert default.timeout is declared.timeout and default.results == declared.results
    assert default.max_restarts == declared.max_restarts and default.monitor_interval == declared.monitor_interval


def test_an_agent_rebuilds_the_kernels_plan_with_every_field_set_otherwise_than_by_default():
    """Every field of the plan, each set to something no default gives, reaches a host's agent (a field added to
    ``LaunchPlan`` without a value here fails this test, so none can be dropped on the way)."""
    declared = {f.name: f for f in fields(LaunchPlan)}
    kernel = LaunchPlan(
        function=print, args=(1,), num_processes=3, num_nodes=4, node_rank=0, device="cpu", backend="mpi",
        start_method="spawn", start_method_reason="requested", master_addr="node-a", master_port=40001,
        requested_port=40000, mixed_precision="bf16", timeout=12.5, max_restarts=2, monitor_interval=0.5,
        log_line_prefix_template="<${rank}> ", rdzv_backend="c10d", rdzv_conf={"join_timeout": 7}, rdzv_id="run-7",
        cpu_threads=5, port_note="29500 was taken", memory_limit=3 * 2**26, batch_sizes={"train": 16}, debug=False,
        results="all", hang_warning=None, in_workers=True, detached=True,
        xla=XlaLayout("CPU", 4, 1, {"PJRT_DEVICE": "CPU"}))
    for name, f in declared.items():
        assert getattr(kernel, name) != f.default, f"give {name} a value other than its default here"

    sent = json.loads(json.dumps(kernel.for_agent(node_rank=2)))  # as the kernel writes it to the agent
    on_agent = plan_on_agent(sent, print, [1], "10.0.0.7", 40123)

    carried = set(declared) - set(DECIDED_ON_EACH_HOST)
    assert {name: getattr(on_agent, name) for name in carried} == {
        name: getattr(dataclasses.replace(kernel, node_rank=2), name) for name in carried}
    assert (on_agent.master_addr, on_agent.master_port, on_agent.requested_port) == ("10.0.0.7", 40123, 40123)
    assert (on_agent.start_method, on_agent.rdzv_backend, on_agent.in_workers, on_agent.xla) == (
        "fork", "static", True, None)
    assert on_agent.cpu_threads >= 1 and on_agent.function is print and on_agent.args == (1,)
    assert on_agent.env_for(0)["NOTEBOOK_LAUNCHER_BATCH_SIZES"] == '{"train": 16}'


def test_the_magics_options_are_the_declarations():
    from notebook_launcher.magic import AccelerateMagics

    parser = AccelerateMagics.accelerate.parser
    by_keyword = {action.dest: action for action in parser._actions}
    with_option = [f for f in fields(LaunchKeywords) if f.metadata["option"] is not None]
    assert {f.name for f in with_option} >= {"num_processes", "device", "start_method", "hang_warning", "display"}
    for f in with_option:
        assert by_keyword[f.name].default == f.default, f.name
    given = parser.parse_args(["--device", "xla", "--hang-warning", "off", "--text", "--debug", "--port", "29600"])
    assert (given.num_processes, given.device, given.hang_warning, given.display, given.debug, given.use_port) == (
        None, "xla", None, "text", True, "29600")  # None goes on to make_plan: there, the XLA device count
