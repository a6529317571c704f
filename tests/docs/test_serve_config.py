#!/usr/bin/env python3
"""test_serve_config.py -- src/serve/README.md's configuration reference against the binary.

`kvrouter serve --help` prints every option of serve's table (src/core/config.c, through
src/base/cli.c's kvr_cli_help): a line "  --name ARG", then its help text, indented, ending with
"(default D; JSON: key)", "(JSON: key)" or "(default D)" when it has either. The defaults are read
from the settings struct the program starts with, so they are the binary's own. This test reads
that and the table under "## Configuration reference" (columns flag | JSON key | default |
meaning) and checks:

  1. the same flags: every flag --help prints (but -h/--help and --version) has a row (a missing
     one is reported with a row built from --help to start from), every row's flag exists;
  2. the same JSON key per flag ("—" in the table when --help names none);
  3. the same default: the table's default up to its first " (" (backticks dropped) equals the one
     --help prints; "—" stands for "prints none" (a flag without a default, or whose default the
     help text explains);
  4. the "Signals and config reload" section accounts for every JSON key: each is named there
     (literally, or by a pattern like `limits.max_*`) as applied at once or needing a restart, and
     every key-like code span there is a real key (or a pattern matching one);
  5. every --flag the manual mentions outside code blocks is a serve flag, or one of the other
     programs' flags listed in FOREIGN below;
  6. every metric name kvrouter_... that the manual or the top-level README names (a histogram's
     _bucket/_sum/_count suffix dropped; a prefix ending in '_' is a pattern and skipped) is a whole
     word of the router's C sources (src/), so a renamed or removed metric cannot stay documented.

Run: python3 tests/docs/test_serve_config.py --kvrouter build/kvrouter [--root DIR]
Exit 0, 1 with one line per mismatch, 77 when a needed module is missing.
"""
import argparse
import fnmatch
import os
import re
import subprocess
import sys

try:
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mdtext
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(77)

MANUAL = "src/serve/README.md"
NONE = "—"
# Flags of other programs the manual names (vLLM's, the other kvrouter subcommands', scripts').
FOREIGN = {
    "--kv-events-config": "vLLM's (and kvrouter sim's) KV-event publisher",
    "--enable-prompt-tokens-details": "vLLM's usage details",
    "--enable-force-include-usage": "vLLM's usage in every stream",
    "--enable-lora": "vLLM's LoRA switch",
    "--lora-modules": "vLLM's static LoRA adapters",
    "--max-loras": "vLLM's adapters per batch",
    "--max-cpu-loras": "vLLM's adapters kept in memory",
    "--data-parallel-size": "vLLM's data-parallel engines behind one API server",
    "--api-server-count": "vLLM's API server processes",
    "--data-parallel-rank": "vLLM's external-LB rank of one API server",
    "--out": "a bench script's output folder (bench/scripts/*/)",

    "--ab": "kvrouter bench",
    "--dataset-name": "vllm bench serve's dataset choice (timed_trace reads traces)",
    "--url": "kvrouter bench",
    "--kvrouter": "the Python tests' and scripts' binary",
    "--cores": "bench/scripts/fastpath/fastpath.sh",
    "--quick": "bench/scripts/fastpath/fastpath.sh",
    "--seeds": "kvrouter bench study",
    "--help": "every subcommand",
    "--version": "every subcommand",
    "--flag": "the error line's placeholder",
}
TAIL = re.compile(r"\((?:default (?P<d1>[^;()]*); JSON: (?P<j1>[\w.]+)|JSON: (?P<j2>[\w.]+)|"
                  r"default (?P<d2>[^()]*))\)$")


def help_options(kvrouter):
    """{flag: (json key or None, default or None, placeholder, help text)} from serve --help."""
    out = subprocess.run([kvrouter, "serve", "--help"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise SystemExit("FAIL kvrouter serve --help exited %d: %s" % (out.returncode, out.stderr))
    opts, cur, arg, text = {}, None, "", []

    def flush():
        if cur is None:
            return
        joined = " ".join(text).strip()
        m = TAIL.search(joined)
        if m:
            opts[cur] = (m.group("j1") or m.group("j2"), m.group("d1") or m.group("d2"), arg,
                         joined[:m.start()].strip())
        else:
            opts[cur] = (None, None, arg, joined)

    for line in out.stdout.split("\n"):
        m = re.match(r"^  (--[a-z0-9-]+)(?:[ =](.*))?$", line)
        if m:
            flush()
            cur, arg, text = m.group(1), (m.group(2) or "").strip(), []
        elif re.match(r"^  -", line):  # "  -h, --help"
            flush()
            cur, text = None, []
        elif cur is not None and line.startswith("      "):
            text.append(line.strip())
        elif cur is not None and line.strip() == "":
            flush()
            cur, text = None, []
    flush()
    for f in ("--help", "--version"):
        opts.pop(f, None)
    return opts


def cells(row):
    """The cells of a Markdown table row, '|' inside code spans kept."""
    out, cur, code = [], "", False
    for c in row.strip().strip("|"):
        if c == "`":
            code = not code
        if c == "|" and not code:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
    out.append(cur.strip())
    return out


def doc_table(section):
    """[(line, flag, json key or None, default or None)] of the configuration table."""
    rows = []
    for n, line in enumerate(section.split("\n"), 1):
        if not line.startswith("| `--"):
            continue
        c = cells(line)
        flag = re.match(r"`(--[a-z0-9-]+)", c[0]).group(1)
        key = c[1].strip("`") if c[1] not in (NONE, "") else None
        d = c[2]
        d = d.split(" (")[0].strip() if not d.startswith("`") else re.match(r"`([^`]*)`", d).group(1)
        rows.append((n, flag, key, None if d in (NONE, "") else d))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvrouter", required=True)
    ap.add_argument("--root", default=mdtext.repo_root())
    args = ap.parse_args()
    with open(os.path.join(args.root, MANUAL), encoding="utf-8") as f:
        text = f.read()
    secs = mdtext.sections(text)
    opts = help_options(args.kvrouter)
    bad = []
    if len(opts) < 40:
        bad.append("--help: only %d options read; has its format changed?" % len(opts))

    table = doc_table(secs.get("Configuration reference", ""))
    documented = {}
    for n, flag, key, default in table:
        if flag in documented:
            bad.append("%s: %s: documented twice" % (MANUAL, flag))
        documented[flag] = (key, default)
    for flag in sorted(set(opts) - set(documented)):
        key, default, arg, text = opts[flag]
        bad.append("%s: %s (JSON %s) is in serve --help but not in the configuration reference; "
                   "a row to start from:\n  | `%s%s` | %s | %s | %s |"
                   % (MANUAL, flag, key, flag, " " + arg if arg else "",
                      "`%s`" % key if key else NONE, default or NONE, text))
    for flag in sorted(set(documented) - set(opts)):
        bad.append("%s: %s is documented but serve --help has no such flag" % (MANUAL, flag))
    for flag in sorted(set(documented) & set(opts)):
        (dk, dd), (hk, hd) = documented[flag], opts[flag][:2]
        if dk != hk:
            bad.append("%s: %s: JSON key %s documented, --help says %s" % (MANUAL, flag, dk, hk))
        if dd != hd:
            bad.append("%s: %s: default %s documented, --help says %s"
                       % (MANUAL, flag, dd or NONE, hd or "(none)"))

    keys = {o[0] for o in opts.values() if o[0]}
    reload = secs.get("Signals and config reload", "")
    named = set()
    for span in re.findall(r"`([^`\s]+)`", reload):
        if not re.fullmatch(r"[a-z_]+(\.[a-z_*]+)*", span) or ("_" not in span and "." not in span
                                                              and span not in keys):
            continue
        hits = fnmatch.filter(keys, span)
        if not hits:
            bad.append("%s: reload section names `%s`, which is no JSON key" % (MANUAL, span))
        named.update(hits)
    for k in sorted(keys - named):
        bad.append("%s: reload section does not say whether %s applies at once or needs a restart"
                   % (MANUAL, k))

    for n, line in mdtext.prose_lines(text):
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", line):
            if flag not in opts and flag not in FOREIGN:
                bad.append("%s:%d: %s is no serve flag (nor listed in FOREIGN)" % (MANUAL, n, flag))

    sources = ""
    for d, _, names in os.walk(os.path.join(args.root, "src")):
        for n in names:
            if n.endswith((".c", ".h")):
                with open(os.path.join(d, n), encoding="utf-8", errors="replace") as f:
                    sources += f.read() + "\n"
    nmetrics = 0
    for doc in (MANUAL, "README.md"):
        with open(os.path.join(args.root, doc), encoding="utf-8") as f:
            names = sorted(set(re.findall(r"\bkvrouter_[a-z0-9_]+", f.read())))
        for name in names:
            if name.endswith("_"):
                continue
            nmetrics += 1
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if not re.search(r"\b%s\b" % re.escape(base), sources):
                bad.append("%s: metric %s is not in the router's sources (src/)" % (doc, name))

    for line in bad:
        print("FAIL " + line)
    print("metrics named: %d; " % nmetrics, end="")
    print("serve --help: %d options; reference: %d rows; reload section: %d of %d keys; %d problems"
          % (len(opts), len(table), len(named), len(keys), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
