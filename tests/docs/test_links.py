#!/usr/bin/env python3
"""test_links.py -- every relative link of every tracked Markdown file resolves.

For each tracked *.md file (git ls-files; the generated bench/results/**/REPORT.md excluded), every
inline link or image [text](target) and reference definition [label]: target outside code blocks
and code spans, whose target has no URL scheme (http:, mailto:, ...), must name an existing file or
folder relative to the file (a leading '/' is the repository root). A #fragment must be an anchor
of its target when the target is a Markdown file (or, for a bare #fragment, of the file itself):
a heading's GitHub slug (mdtext.github_slug) or an explicit <a name=...>/id anchor. A fragment on a
folder is checked against its README.md when it has one.

Also checked, for the documents this test's owner keeps (README.md, src/README.md,
src/serve/README.md): every repository path they quote in a code span (`bench/...`, `src/...`,
`deploy/...`, `tests/...`, `policies/...`, `router/...`, `.ci/...`) exists, so a moved script or
result folder cannot leave a dangling command behind.

Run: python3 tests/docs/test_links.py [--root DIR]. Exit 0 when every link resolves, 1 with one
line per broken link (file:line: target: why), 77 when a needed module is missing.
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

INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
OWN_DOCS = ("README.md", "src/README.md", "src/serve/README.md")
PATH_SPAN = re.compile(r"`((?:bench|src|deploy|tests|policies|router|\.ci)/[A-Za-z0-9_./+-]*)`")


def excluded(path):
    return path.startswith("bench/results/") and path.endswith("/REPORT.md")


def links(text):
    """[(line number, target)] of the relative links outside code."""
    out = []
    for n, line in mdtext.prose_lines(text):
        prose = mdtext.strip_code_spans(line)
        for m in INLINE.finditer(prose):
            out.append((n, m.group(1).strip("<>")))
        m = REFDEF.match(prose)
        if m:
            out.append((n, m.group(1).strip("<>")))
    return [(n, t) for n, t in out if not SCHEME.match(t)]


class Anchors:
    def __init__(self, root):
        self.root, self.cache = root, {}

    def of(self, path):
        if path not in self.cache:
            with open(os.path.join(self.root, path), encoding="utf-8", errors="replace") as f:
                self.cache[path] = mdtext.anchors(f.read())
        return self.cache[path]


def check_link(root, doc, target, anchors):
    """None when target (as written in doc) resolves, else why not."""
    path, _, frag = target.partition("#")
    if path == "":
        dest = doc
    elif path.startswith("/"):
        dest = os.path.normpath(path.lstrip("/"))
    else:
        dest = os.path.normpath(os.path.join(os.path.dirname(doc), path))
    dest = dest.replace(os.sep, "/")
    if dest.startswith("../") or dest == "..":
        return "points outside the repository"
    full = os.path.join(root, dest)
    if not os.path.exists(full):
        return "no such file or folder: %s" % dest
    if not frag:
        return None
    if os.path.isdir(full):
        if not os.path.isfile(os.path.join(full, "README.md")):
            return None
        dest = dest.rstrip("/") + "/README.md"
    if not dest.endswith(".md"):
        return None
    if frag not in anchors.of(dest):
        return "no anchor #%s in %s" % (frag, dest)
    return None


def check_paths(root, doc, text):
    """Broken code-span repository paths of one of the owner's documents: [(line, path, why)]."""
    out = []
    for n, line in mdtext.prose_lines(text):
        for m in PATH_SPAN.finditer(line):
            p = m.group(1).rstrip(".,;:")
            if any(c in p for c in "*<>") or "OWNER" in p:
                continue
            if not os.path.exists(os.path.join(root, p)):
                out.append((n, p, "quoted path does not exist"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=mdtext.repo_root())
    ap.add_argument("--kvrouter", help="ignored (CTest passes it to every script test)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    anchors = Anchors(root)
    bad, nlinks = [], 0
    docs = mdtext.markdown_files(root, excluded)
    for doc in docs:
        with open(os.path.join(root, doc), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for n, target in links(text):
            nlinks += 1
            why = check_link(root, doc, target, anchors)
            if why:
                bad.append("%s:%d: %s: %s" % (doc, n, target, why))
        if doc in OWN_DOCS:
            for n, p, why in check_paths(root, doc, text):
                bad.append("%s:%d: %s: %s" % (doc, n, p, why))
    for line in bad:
        print("FAIL " + line)
    print("%d Markdown files, %d relative links, %d broken" % (len(docs), nlinks, len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
