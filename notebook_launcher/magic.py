"""``%%accelerate``: run a notebook cell on every rank and get the names it assigns back from rank 0.

    %load_ext notebook_launcher

    %%accelerate -n 2 --debug
    model = Net()
    ...
    history = [...]

The cell goes through ``notebook_launcher()`` itself (no second launcher): the same display, debug mode, logging,
out-of-memory retries, triggers and hang diagnosis.
"""

from __future__ import annotations

import ast
import linecache
import os
import sys

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .keywords import magic_options
from .notebook_objects import unchanged_note

MAX_RETURN_BYTES = 2**30  # a value bigger than this pickled stays on the ranks
KEYWORD_OPTIONS = magic_options()  # (flags, settings) of each keyword %%accelerate takes, declared in keywords.py


def _keyword_options(magic):
    """The options made from the keywords' declaration, in its order, each stored under its keyword's name."""
    for flags, settings in reversed(KEYWORD_OPTIONS):
        magic = argument(*flags, **settings)(magic)
    return magic


class CellProgram:
    """What each rank runs: the cell's code in a namespace made of the notebook names it uses.

    Under fork the names are inherited as they are; under spawn they travel with cloudpickle. Rank 0 sends back
    the names the cell assigned at top level (those that can be pickled and are not too large).
    """

    def __init__(self, source: str, filename: str, namespace: dict, return_names: list[str]):
        self.source = source
        self.filename = filename
        self.namespace = namespace
        self.return_names = return_names
        self.ran_in = None  # the process that ran it last: the kernel itself for one process (copies elsewhere)

    def __call__(self):
        self.ran_in = os.getpid()
        _register_source(self.filename, self.source)  # so tracebacks show the cell's own lines
        namespace = dict(self.namespace, __name__="__main__")
        exec(compile(self.source, self.filename, "exec"), namespace)
        if os.environ.get("RANK", "0") != "0":
            return None
        return _returnable(namespace, self.return_names)


def _returnable(namespace: dict, names: list[str]) -> dict:
    import cloudpickle

    values, skipped = {}, {}
    for name in names:
        if name not in namespace:
            continue
        value = namespace[name]
        if isinstance(value, type(sys)):
            continue  # modules: the notebook imports its own
        try:
            pickled = cloudpickle.dumps(_on_cpu(value))
        except Exception as exc:  # noqa: BLE001
            skipped[name] = f"cannot be pickled ({type(exc).__name__}: {str(exc)[:120]})"
            continue
        if len(pickled) > MAX_RETURN_BYTES:
            skipped[name] = f"too large ({len(pickled) / 2**30:.1f} GiB pickled)"
            continue
        values[name] = pickled  # one pickle per name: the kernel loads each on its own
    return {"values": values, "skipped": skipped}


def _on_cpu(value):
    torch = sys.modules.get("torch")
    return value.detach().cpu() if torch is not None and isinstance(value, torch.Tensor) else value


def _load_each(pickled: dict, skipped: dict) -> dict:
    """Each returned name unpickled on its own, so one that cannot live in the kernel (a DDP wrapper needs its
    process group) is skipped with the reason instead of losing them all."""
    import cloudpickle

    values = {}
    for name, data in pickled.items():
        try:
            values[name] = cloudpickle.loads(data)
        except Exception as exc:  # noqa: BLE001
            skipped[name] = f"cannot be loaded in the kernel ({type(exc).__name__}: {str(exc)[:120]})"
    return values


def _register_source(filename: str, source: str) -> None:
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def names_used(tree: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def names_assigned(tree: ast.Module) -> list[str]:
    """The names the cell binds in the notebook's scope, in order: assignments anywhere outside functions and
    classes (inside loops and ifs too), and the names of the functions and classes it defines."""
    names: list[str] = []

    class Collector(ast.NodeVisitor):
        def visit_Name(self, node):  # noqa: N802 - ast's naming
            if isinstance(node.ctx, ast.Store) and node.id not in names:
                names.append(node.id)

        def visit_FunctionDef(self, node):  # noqa: N802
            if node.name not in names:
                names.append(node.name)  # its body has a scope of its own

        visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef  # noqa: N815

        def visit_Lambda(self, node):  # noqa: N802
            pass

        def visit_ListComp(self, node):  # noqa: N802
            pass

        visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_ListComp  # noqa: N815

    Collector().visit(tree)
    return names


@magics_class
class AccelerateMagics(Magics):
    @line_magic
    def accelerate_doctor(self, line):
        """Check this machine against the troubleshooting guide: ``%accelerate_doctor [-n N] [--hostfile F]``."""
        from .doctor import doctor

        args = parse_argstring(self.accelerate_doctor, line)
        return doctor(num_processes=args.num_processes, hostfile=args.hostfile)

    accelerate_doctor = magic_arguments()(
        argument("-n", "--num-processes", type=int, default=None, help="ranks you plan to start")(
            argument("--hostfile", default=None, help="hosts for the multi-CPU (MPI/SSH) checks")(
                accelerate_doctor)))

    @magic_arguments()
    @_keyword_options
    @argument("--return", dest="return_names", default=None,
              help="comma-separated names to bring back from rank 0 (default: all the cell assigns)")
    @argument("--no-return", action="store_true", help="bring nothing back")
    @cell_magic
    def accelerate(self, line, cell):
        """Run this cell on every rank with notebook_launcher; names it assigns come back from rank 0.

        The cell sees the notebook's names (inherited under fork, sent with cloudpickle under spawn). After a
        successful run the names the cell assigned at top level are set in the notebook from rank 0 (tensors
        on the CPU); one line says which came back and which were skipped and why. Errors show the cell's own
        line numbers and the rank. In Jupyter the run shows as the live panel; ``--text`` prints each rank's
        lines as plain text instead, prefixed ``[rank 0] ``, ``[rank 1] `` ...

        Example::

            %%accelerate -n 2 --debug --mixed-precision bf16
            model = Net()
            ...
            history = train(model)
        """
        __tracebackhide__ = True  # IPython shows the error, not this frame
        from . import plan as planning
        from .launcher import notebook_launcher

        args = parse_argstring(self.accelerate, line)
        source = self.shell.transform_cell(cell)
        tree = ast.parse(source)
        user_ns = self.shell.user_ns
        namespace = {name: user_ns[name] for name in sorted(names_used(tree)) if name in user_ns}
        if args.no_return:
            return_names = []
        elif args.return_names:
            return_names = [name.strip() for name in args.return_names.split(",") if name.strip()]
        else:
            return_names = names_assigned(tree)
        keywords = {settings["dest"]: getattr(args, settings["dest"]) for _, settings in KEYWORD_OPTIONS}
        if planning.spawns(keywords["start_method"], keywords["device"]):  # (a detached run's supervisor too)
            _check_picklable(namespace, "--detach" if keywords["detach"] else "")
        count = max(1, getattr(self.shell, "execution_count", 1) - 1)  # IPython counts this cell already
        filename = f"<accelerate cell In[{count}]>"
        source = "\n" + source  # line numbers as the notebook shows them, the %%accelerate line being line 1
        _register_source(filename, f"%%accelerate {line}" + source)
        program = CellProgram(source, filename, namespace, return_names)
        result = notebook_launcher(program, **keywords)
        if keywords["detach"]:
            return result  # the DetachedRun, shown as its panel; what the cell assigns stays in the run
        values = {}
        if return_names and isinstance(result, dict):
            skipped = dict(result["skipped"])
            values = _load_each(result["values"], skipped)
            user_ns.update(values)
            came_back = ", ".join(values) or "nothing"
            note = f"notebook_launcher: back from rank 0: {came_back}"
            if skipped:
                note += "; skipped: " + "; ".join(f"{name} ({why})" for name, why in skipped.items())
            print(note)
        unchanged = None if program.ran_in == os.getpid() else unchanged_note(program, (), values)
        if unchanged:  # the ranks trained copies of a model of the notebook's, and no weights came back
            print(unchanged)
        return None


def _check_picklable(namespace: dict, detach: str = "") -> None:
    from .launchers.payload import first_unpicklable

    culprit = first_unpicklable(namespace.items())
    if culprit:
        name, value, exc = culprit
        where, fix = (("a detached run's supervisor", "leave out --detach") if detach else
                      ("spawned workers", "use --start-method fork"))
        raise TypeError(
            f"the cell uses `{name}` (a {type(value).__name__}), which cannot be sent to {where} "
            f"({type(exc).__name__}: {exc}). Create it inside the cell, or {fix}.") from None


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(AccelerateMagics)
