"""mdtext -- the Markdown reading the documentation tests share (tests/docs/test_*.py).

Only the Python standard library. What it knows of Markdown is what the repository's documents use:
fenced code blocks (``` or ~~~), ATX headings (# ...), inline code spans, inline links and images
[text](target) and reference definitions [label]: target.

- repo_root(): the repository these tests sit in (tests/docs/ -> ../..).
- markdown_files(root, exclude): the tracked *.md files (git ls-files; a walk without git), as
  repo-relative paths with '/' separators, that exist in the working tree.
- prose_lines(text): [(line number, line)] outside fenced code blocks.
- github_slug(heading) and anchors(text): the anchors GitHub gives a file's headings (github-slugger:
  lower case, inline Markdown reduced to its text, every character but letters, digits, '_', '-'
  and spaces dropped, spaces to '-', a repeated slug suffixed -1, -2, ...) plus explicit
  <a name=...> / id="..." anchors.
- sections(text): {heading text: body text} for every heading.
"""
import os
import re
import subprocess

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def repo_root():
    return os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def markdown_files(root, exclude=None):
    """Tracked *.md files (repo-relative, '/'), present on disk, minus those exclude(path) rejects."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--", "*.md"], check=True,
                             capture_output=True).stdout.decode()
        paths = [p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = []
        for d, subs, names in os.walk(root):
            subs[:] = [s for s in subs if not s.startswith((".", "build")) and s != "node_modules"]
            paths += [os.path.relpath(os.path.join(d, n), root).replace(os.sep, "/")
                      for n in names if n.endswith(".md")]
    paths = sorted(set(p for p in paths if os.path.isfile(os.path.join(root, p))))
    return [p for p in paths if not (exclude and exclude(p))]


def prose_lines(text):
    """[(1-based line number, line)] of the lines outside fenced code blocks (fences excluded)."""
    out, fence = [], None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            continue
        if fence is not None:
            if line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
                fence = None
            continue
        out.append((n, line))
    return out


def strip_code_spans(line):
    """The line with each inline code span replaced by spaces of its length (columns kept)."""
    return re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line)


def inline_text(md):
    """The text GitHub renders for inline Markdown: code spans, links, images and emphasis reduced
    to their text, HTML tags dropped."""
    s = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", md)
    s = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = re.sub(r"\[([^\]]*)\]\[[^\]]*\]", r"\1", s)
    s = re.sub(r"<[^>]+>", "", s)
    s = s.replace("`", "")
    s = re.sub(r"(\*\*|__)(.+?)\1", r"\2", s)
    s = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"\1", s)
    return s


def github_slug(heading):
    s = inline_text(heading).strip().lower()
    s = re.sub(r"[^\w\- ]", "", s, flags=re.UNICODE)
    return s.replace(" ", "-")


def headings(text):
    """[(line number, level, heading text)] outside fenced code blocks."""
    out = []
    for n, line in prose_lines(text):
        m = HEADING.match(line)
        if m:
            out.append((n, len(m.group(1)), m.group(2)))
    return out


def anchors(text):
    """Every anchor a #fragment may name in this file, as GitHub makes them."""
    seen, out = {}, set()
    for _, _, h in headings(text):
        base = github_slug(h)
        k = seen.get(base, 0)
        out.add(base if k == 0 else "%s-%d" % (base, k))
        seen[base] = k + 1
    for m in re.finditer(r"""<a\s+(?:name|id)\s*=\s*["']([^"']+)["']""", text):
        out.add(m.group(1))
    for m in re.finditer(r"""\sid\s*=\s*["']([^"']+)["']""", text):
        out.add(m.group(1))
    return out


def sections(text):
    """{heading text: the lines up to the next heading of the same or a higher level, joined}."""
    lines = text.split("\n")
    hs = headings(text)
    out = {}
    for i, (n, level, h) in enumerate(hs):
        end = len(lines) + 1
        for n2, level2, _ in hs[i + 1:]:
            if level2 <= level:
                end = n2
                break
        out[h] = "\n".join(lines[n:end - 1])
    return out


def exit_skip(module):
    """Exit 77 (CTest's skip) naming a missing module."""
    print("SKIP: python module %s is missing" % module)
    raise SystemExit(77)
