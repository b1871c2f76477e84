"""The launch keywords, written in three places (the signature users see in help(), the plan that checks them,
the README's table), agree: names, order and defaults. Adding a keyword and forgetting one place fails here."""

import inspect
import os
import re

from notebook_launcher import notebook_launcher
from notebook_launcher.plan import make_plan

HOST_KEYWORDS = ("display", "hosts", "hostfile", "ssh_options", "start_hosts_with", "mpirun_options",
                 "slurm_options")  # not the plan's
README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def defaults(function) -> dict:
    return {name: parameter.default for name, parameter in inspect.signature(function).parameters.items()}


def test_the_plan_takes_every_keyword_of_the_signature_with_the_same_default():
    public = defaults(notebook_launcher)
    planned = defaults(make_plan)
    planned.pop("in_workers")
    assert public.pop("function") is inspect.Parameter.empty and planned.pop("function") is inspect.Parameter.empty
    for name in HOST_KEYWORDS:
        public.pop(name)
    assert public == planned
    assert all(type(public[name]) is type(planned[name]) for name in public), "a default of another type"


def test_the_readme_shows_the_signature_as_it_is():
    with open(README) as readme:
        text = readme.read()
    shown = re.search(r"```python\nnotebook_launcher\((.*?)\)\n```", text, re.S).group(1)
    shown = " ".join(shown.split())
    parts, starred = [], False
    for name, parameter in inspect.signature(notebook_launcher).parameters.items():
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and not starred:
            parts.append("*")
            starred = True
        default = parameter.default
        parts.append(name if default is inspect.Parameter.empty else f"{name}={default!r}".replace("'", '"'))
    assert shown == ", ".join(parts)
