"""``python -m notebook_launcher doctor [-n N] [--hostfile F]``, ``python -m notebook_launcher env``, and with no
command, help."""

import argparse
import sys

from .doctor import doctor, env_report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m notebook_launcher")
    commands = parser.add_subparsers(dest="command")
    check = commands.add_parser("doctor", help="check this machine against the troubleshooting guide")
    check.add_argument("-n", "--num-processes", type=int, default=None, help="ranks you plan to start")
    check.add_argument("--hostfile", default=None, help="hosts for the multi-CPU (MPI/SSH) checks")
    commands.add_parser("env", help="versions, devices and settings, to paste into a bug report")
    args = parser.parse_args(argv)
    if args.command is None:  # no command: what there is, and how to launch from a notebook
        parser.print_help()
        print("\nIn a notebook: from notebook_launcher import notebook_launcher; "
              "notebook_launcher(train, num_processes=2)\n(or %load_ext notebook_launcher, then %%accelerate -n 2)")
        return 0
    if args.command == "env":
        print(env_report())
        return 0
    report = doctor(num_processes=args.num_processes, hostfile=args.hostfile)
    print(report)
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
