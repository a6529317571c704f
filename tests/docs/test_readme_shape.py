#!/usr/bin/env python3
"""test_readme_shape.py -- the top-level README stays a ten-minute read with a two-command start.

Checks README.md:
  1. it has fewer than 300 lines;
  2. its "Quickstart" section holds exactly one shell code block (```sh, ```bash or ```console;
     other blocks there are program output) and that block exactly two commands (a command is a
     non-blank line that is not a comment, with its backslash continuations), and they are the
     two of the issue: `bash deploy/run-demo.sh` and `bash deploy/run-tests.sh`, both scripts
     present;
  3. the first `kvrouter serve --worker ...` example (a code block line starting `kvrouter serve`
     whose command names --worker) comes within the first 300 words;
  4. there is exactly one section about what vLLM needs ("In front of vLLM"), and it names each
     thing a `vllm serve` must be started with for every feature: --kv-events-config with its
     endpoint and replay_endpoint, --enable-prompt-tokens-details, --enable-force-include-usage,
     VLLM_SERVER_DEV_MODE, the block size and PYTHONHASHSEED.

Run: python3 tests/docs/test_readme_shape.py [--root DIR]. Exit 0, 1 with one line per problem,
77 when a needed module is missing.
"""
import argparse
import os
import re
import sys

try:
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import mdtext
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(77)

MAX_LINES = 300
MAX_WORDS_BEFORE_SERVE = 300
QUICKSTART = ["bash deploy/run-demo.sh", "bash deploy/run-tests.sh"]
VLLM_NEEDS = ["--kv-events-config", '"endpoint"', '"replay_endpoint"', "--enable-prompt-tokens-details",
              "--enable-force-include-usage", "VLLM_SERVER_DEV_MODE", "--block-size", "PYTHONHASHSEED"]


def code_blocks(section):
    """[(info string, [lines])] of the fenced blocks of a section's text."""
    out, cur, info = [], None, None
    for line in section.split("\n"):
        m = re.match(r"^\s{0,3}(```+|~~~+)\s*(\S*)", line)
        if m and cur is None:
            cur, info = [], m.group(2)
        elif m and cur is not None:
            out.append((info, cur))
            cur = None
        elif cur is not None:
            cur.append(line)
    return out


def commands(lines):
    """The commands of a shell block: comments dropped, continuations joined."""
    out, cur = [], ""
    for line in lines:
        s = line.split(" #")[0].rstrip() if not line.lstrip().startswith("#") else ""
        if not s.strip() and not cur:
            continue
        cur += (" " if cur else "") + s.strip().rstrip("\\").strip()
        if not s.endswith("\\"):
            out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=mdtext.repo_root())
    ap.add_argument("--kvrouter", help="ignored (CTest passes it to every script test)")
    args = ap.parse_args()
    with open(os.path.join(args.root, "README.md"), encoding="utf-8") as f:
        text = f.read()
    bad = []
    nlines = len(text.rstrip("\n").split("\n"))
    if nlines >= MAX_LINES:
        bad.append("README.md has %d lines (fewer than %d wanted)" % (nlines, MAX_LINES))

    secs = mdtext.sections(text)
    quick = [h for h in secs if h.lower().startswith("quickstart")]
    if len(quick) != 1:
        bad.append("README.md: %d Quickstart sections (one wanted)" % len(quick))
    else:
        shell = [b for info, b in code_blocks(secs[quick[0]]) if info in ("sh", "bash", "console", "shell")]
        if len(shell) != 1:
            bad.append("README.md: the Quickstart has %d shell blocks (one wanted)" % len(shell))
        else:
            cmds = commands(shell[0])
            if cmds != QUICKSTART:
                bad.append("README.md: the Quickstart's commands are %r, not %r" % (cmds, QUICKSTART))
        for c in QUICKSTART:
            if not os.path.isfile(os.path.join(args.root, c.split()[-1])):
                bad.append("README.md: %s: no such script" % c)

    words, found = 0, None
    lines = text.split("\n")
    in_code = False
    for i, line in enumerate(lines):
        if re.match(r"^\s{0,3}(```|~~~)", line):
            in_code = not in_code
            continue
        if in_code and line.startswith("kvrouter serve"):
            cmd = line
            j = i
            while cmd.rstrip().endswith("\\") and j + 1 < len(lines):
                j += 1
                cmd += " " + lines[j]
            if "--worker" in cmd:
                found = words
                break
        words += len(line.split())
    if found is None:
        bad.append("README.md: no `kvrouter serve ... --worker ...` example in a code block")
    elif found > MAX_WORDS_BEFORE_SERVE:
        bad.append("README.md: %d words before the first `kvrouter serve --worker` example (at most %d)"
                   % (found, MAX_WORDS_BEFORE_SERVE))

    vllm = [h for h in secs if "vllm" in h.lower()]
    if vllm != ["In front of vLLM"]:
        bad.append("README.md: sections about vLLM %r (one, \"In front of vLLM\", wanted)" % vllm)
    else:
        for need in VLLM_NEEDS:
            if need not in secs["In front of vLLM"]:
                bad.append("README.md: \"In front of vLLM\" does not name %s" % need)

    for line in bad:
        print("FAIL " + line)
    print("README.md: %d lines, %s words before the first serve example, %d problems"
          % (nlines, found, len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
