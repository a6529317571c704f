#!/usr/bin/env python3
"""provenance.py -- the first line of every REPORT.md a bench script writes: the command that made
it and the repository's commit (shared: bench/scripts/lib/).

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
    from provenance import first_line
    lines = [first_line(), "", "# Title", ...]

first_line() is "Made by `COMMAND` at commit SHA, DATE." where COMMAND is KVR_REPORT_COMMAND when
the environment has it (a shell script that renders its report through a Python one exports its own
command line there first, see `command` below), else this process's own: `python3 SCRIPT ARGS...`
with SCRIPT, and any other argument that names an existing file or folder inside the repository,
relative to the repository's root. SHA is `git rev-parse --short HEAD` of this checkout, "+dirty"
when tracked files outside bench/results/ (which a run writes) differ from it, "unknown" outside a
git checkout; DATE is the UTC date.

Shell use: `python3 bench/scripts/lib/provenance.py command [--env PREFIX]... -- ARGV...` prints
ARGV as one shell-quoted command line, each variable of the environment whose name starts with a
PREFIX in front of it as NAME=VALUE, and a file or folder ARGV names inside the repository relative
to its root; e.g. in ab.sh:
    KVR_REPORT_COMMAND=$(python3 "$HERE/../lib/provenance.py" command --env AB_ -- sh "$0" "$@")
    export KVR_REPORT_COMMAND
`python3 bench/scripts/lib/provenance.py first-line` prints first_line().
The standard library only.
"""
import argparse
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
ENV = "KVR_REPORT_COMMAND"


def commit():
    """`git rev-parse --short HEAD`, "+dirty" when tracked files outside bench/results/ differ."""
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        st = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no",
                             "--", ".", ":!bench/results"], capture_output=True, text=True,
                            check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+dirty" if st.strip() else "")


def repo_relative(arg):
    """arg relative to the repository's root when it names an existing file or folder inside it."""
    if not os.path.exists(arg):
        return arg
    path = os.path.realpath(arg)
    root = os.path.realpath(ROOT)
    return os.path.relpath(path, root) if path.startswith(root + os.sep) else arg


def command(argv=None, env_prefixes=()):
    """A shell-quoted command line: KVR_REPORT_COMMAND when set and argv is None, else argv
    (default `python3` + sys.argv) with its script made repository-relative and the environment's
    variables whose name starts with one of env_prefixes in front."""
    if argv is None:
        if os.environ.get(ENV):
            return os.environ[ENV]
        argv = ["python3"] + sys.argv
    words = ["%s=%s" % (k, shlex.quote(v)) for k, v in sorted(os.environ.items())
             if any(k.startswith(p) for p in env_prefixes)]
    words += [shlex.quote(repo_relative(a)) for a in argv]
    return " ".join(words)


def first_line(cmd=None, sha=None):
    """"Made by `CMD` at commit SHA, DATE." (CMD default command(), SHA default commit())."""
    return "Made by `%s` at commit %s, %s." % (cmd or command(), sha or commit(),
                                               time.strftime("%Y-%m-%d", time.gmtime()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("command", help="print ARGV as a command line")
    c.add_argument("--env", action="append", default=[], metavar="PREFIX",
                   help="put the environment's PREFIX* variables in front (repeat)")
    c.add_argument("argv", nargs=argparse.REMAINDER)
    sub.add_parser("first-line", help="print the first line of a report made now")
    a = ap.parse_args()
    if a.what == "command":
        argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
        print(command(argv, a.env))
    else:
        print(first_line())


if __name__ == "__main__":
    main()
