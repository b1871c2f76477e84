"""The public surface: every name in ``__all__`` importable, each group sorted, every error of ours under one base
(Accelerate's names kept), and the package typed (py.typed)."""

import inspect
import os

import notebook_launcher
from notebook_launcher import NotebookLauncherError


def test_every_exported_name_exists_and_each_group_is_sorted():
    for name in notebook_launcher.__all__:
        assert hasattr(notebook_launcher, name), name
    source = inspect.getsource(notebook_launcher)
    block = source[source.index("__all__ = ["):source.index("]", source.index("__all__ = ["))]
    groups, current = [], None
    for line in block.splitlines()[1:]:
        line = line.strip()
        if line.startswith("#"):
            current = []
            groups.append(current)
        elif line.startswith('"') and current is not None:
            current.append(line.strip('",'))
    assert len(groups) == 4 and sum(map(len, groups)) == len(notebook_launcher.__all__)
    for group in groups[1:]:
        names = [name for name in group if name != "__version__"]
        assert names == sorted(names), names


def test_every_error_of_ours_is_a_notebook_launcher_error():
    errors = [getattr(notebook_launcher, name) for name in notebook_launcher.__all__
              if isinstance(getattr(notebook_launcher, name), type)
              and issubclass(getattr(notebook_launcher, name), BaseException)]
    assert len(errors) == 9 and all(issubclass(error, NotebookLauncherError) for error in errors)
    assert notebook_launcher.DistributedOperationException.__name__ == "DistributedOperationException"  # Accelerate's


def test_the_package_says_it_is_typed():
    assert os.path.exists(os.path.join(os.path.dirname(notebook_launcher.__file__), "py.typed"))
