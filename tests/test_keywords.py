"""The launch keywords are declared once (``notebook_launcher/keywords.py``): the signature users see in help(),
the plan's defaults and the README's table are made from it, and a call is checked against it."""

import inspect
import os
import re

import pytest

from notebook_launcher import notebook_launcher
from notebook_launcher.keywords import LaunchKeywords, readme_table
from notebook_launcher.plan import make_plan

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


def test_a_positional_call_as_accelerate_users_write_it():
    # num_processes=1 by position: the function runs in this process, as with Accelerate's launcher
    assert notebook_launcher(lambda x: x * 2, (21,), 1) == 42


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
