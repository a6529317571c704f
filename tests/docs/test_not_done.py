#!/usr/bin/env python3
"""test_not_done.py -- every "not done" sentence of the documentation is listed, with its evidence.

A sentence of a tracked Markdown file (bench/results/ excluded: results are dated records) that
says "not done", "pending", "missing", "not yet" or "TODO" (any case, whole words, outside code
blocks and code spans; headings are not sentences) is a claim about the code. Each must match an
entry of ALLOWLIST below: the same file, and the entry's needle inside the sentence. Each entry
carries evidence that the claim still holds, checked against the tree every run:

  absent(REGEX, PATH...)   no file under the paths matches (e.g. no implementation of what is
                           said to be missing);
  present(REGEX, PATH...)  some file under the paths matches (e.g. the behaviour a sentence
                           describes, which uses one of the words without claiming a gap).

The test fails when a sentence matches no entry (a new claim: add an entry with its evidence),
when an entry matches no sentence any more (remove it), and when an entry's evidence fails (the
claim went stale: fix the sentence, then the entry).

Run: python3 tests/docs/test_not_done.py [--root DIR] [--list]. --list prints every claim found.
Exit 0, 1 with one line per problem, 77 when a needed module is missing.
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

WORDS = re.compile(r"\b(not done|pending|missing|not yet|todo)\b", re.IGNORECASE)
SKIP_DIRS = {".git", "node_modules", "build", "build-asan", "build-fuzz", "results", "__pycache__"}


class absent:
    def __init__(self, regex, *paths, flags=0):
        self.rx, self.paths, self.flags = regex, paths, flags

    def check(self, root):
        hits = grep(root, self.rx, self.paths, self.flags)
        if hits:
            return "absent(%r) found it in %s" % (self.rx, ", ".join(hits[:3]))
        return None


class present:
    def __init__(self, regex, *paths, flags=0):
        self.rx, self.paths, self.flags = regex, paths, flags

    def check(self, root):
        missing = [p for p in self.paths if not os.path.exists(os.path.join(root, p))]
        if missing:
            return "present(%r): no such path %s" % (self.rx, ", ".join(missing))
        if not grep(root, self.rx, self.paths, self.flags, first=True):
            return "present(%r) found nothing in %s" % (self.rx, ", ".join(self.paths))
        return None


def grep(root, rx, paths, flags, first=False):
    """Repo-relative files under paths whose text matches rx."""
    pat = re.compile(rx, flags)
    out = []
    for p in paths:
        full = os.path.join(root, p)
        files = [full] if os.path.isfile(full) else []
        for d, subs, names in os.walk(full):
            subs[:] = sorted(s for s in subs if s not in SKIP_DIRS)
            files += [os.path.join(d, n) for n in sorted(names)]
        for f in files:
            try:
                with open(f, encoding="utf-8", errors="replace") as fh:
                    if pat.search(fh.read()):
                        out.append(os.path.relpath(f, root))
                        if first:
                            return out
            except OSError:
                continue
    return out


def entry(file, needle, *evidence, why=""):
    return {"file": file, "needle": needle, "evidence": evidence, "why": why}


# What each sentence claims, and why the evidence shows it is still so.
ALLOWLIST = [
    # ---- README.md: "Not done", what is missing today ------------------------------------------
    entry("README.md", "Not done: a run against real vLLM on GPUs",
          absent(r"vllm serve", "bench/results"),
          why="no committed result was taken against a real `vllm serve`; all come from kvrouter sim"),
    entry("README.md", "Not done: kv_aware at or above every reference policy on every study",
          present(r"\| hot-prefix \|.*\| 0\.99x \(sglang_cache_aware\)", "bench/results/study/REPORT.md"),
          present(r"\| documents \|.*\| 1\.00x \(gie_scorer\)", "bench/results/study/REPORT.md"),
          why="the study's table (bench/results/study/REPORT.md) has kv_aware below the best "
              "reference on those rows"),
    entry("README.md", "Not done: continuing a broken Responses or Messages stream",
          present(r"px->route != KVR_ROUTE_CHAT && px->route != KVR_ROUTE_COMPLETIONS",
                  "src/serve/proxy.c"),
          why="resume_stream() refuses every route but chat and completions"),
    entry("README.md", "Not done: placing `/v1/responses` on a data-parallel rank",
          present(r"/v1/responses ignores it", "src/serve/proxy.c"),
          why="the proxy sends X-data-parallel-rank on every route; vLLM's Responses API does not "
              "read it, and nothing else pins a Responses request to an engine"),
    entry("README.md", "Not done: TLS on kvrouter's own listeners",
          absent(r"SSL_|openssl|gnutls|\btls\b", "src/net/http_server.c", "src/net/http_server.h",
                 flags=re.I),
          absent(r"Egress", "deploy/k8s/kvrouter.yaml"),
          why="the listener speaks plain HTTP; the NetworkPolicy has no Egress policy type"),
    # ---- deploy/README.md ----------------------------------------------------------------------
    entry("deploy/README.md", "egress NetworkPolicy is\nnot done".replace("\n", " "),
          absent(r"Egress", "deploy/k8s/kvrouter.yaml"),
          why="policyTypes holds Ingress only"),
    # ---- src/serve/README.md: behaviour described with one of the words, no gap claimed ---------
    entry("src/serve/README.md", "Not done: unloading",
          absent(r"unload_lora_adapter", "src/serve/lora.c", "src/serve/lora.h", "src/serve/proxy.c",
                 "src/core", "src/proto", flags=0),
          why="the router only loads adapters (serve/lora.c); no code sends an unload"),
    entry("src/serve/README.md", "missing `model`/`messages`/`prompt` is a 400",
          present(r"fail_missing\(out, \"model\"", "src/proto/prompt.c"),
          why="the request validation answers a missing field with 400"),
    entry("src/serve/README.md", "missing or wrong token gets `401`",
          present(r"invalid_api_key", "src/serve/admin.c"),
          why="the admin API's 401"),
    entry("src/serve/README.md", "a gap asks the replay socket for the missing batches",
          present(r"replay", "src/net/kv_sub.c"),
          why="kv_sub's replay on a sequence gap"),
    # ---- bench/ and policies/: behaviour described with one of the words -------------------------
    entry("bench/loadgen/README.md", "a missing field or a negative length is one line naming",
          present(r"missing field '%s'", "src/proto/trace.c"),
          why="the trace reader's error for a line without a field"),
    entry("bench/sim/README.md", "for bad JSON, missing or bad",
          present(r"BadRequestError", "bench/sim/sim_server.c"),
          why="the simulated worker's 400 body"),
    entry("bench/vcluster/README.md", "step in flight not done yet in virtual time",
          present(r"step", "bench/vcluster/vcluster.c"),
          why="describes the virtual cluster's engine step, no gap"),
    entry("policies/README.md", "`queued_prefill_tokens` (uncached prompt tokens not yet",
          present(r"queued_prefill_tokens", "src/core/router.h"),
          why="the load figure's definition"),
    entry("policies/README.md", "prefill pending when dispatched",
          present(r"kvr_prefill_clock_backlog", "src/core/prefill_clock.h"),
          why="the prefill clock's description"),
    entry("policies/README.md", "the backlog is the pending count",
          present(r"kvr_prefill_clock_backlog", "src/core/prefill_clock.h"),
          why="the prefill clock before its first sample"),
    entry("policies/README.md", "the pending count alone made kv_aware",
          present(r"kvr_prefill_clock_backlog", "src/core/prefill_clock.h"),
          why="why the prefill clock exists"),
    entry("policies/README.md", "uncached in-flight prompt tokens not yet",
          present(r"llmd_precise", "policies/llmd_precise.c"),
          why="llmd_precise's queue term"),
    entry("policies/README.md", "llm-d skips the gate when predictions are missing",
          present(r"llmd_precise", "policies/llmd_precise.c"),
          why="describes llm-d's behaviour that the policy reproduces"),
]


def excluded(path):
    return path.startswith("bench/results/")


def sentences(text):
    """[(line number, sentence)] of the prose (code blocks, headings excluded; code spans kept)."""
    blocks, cur, start = [], [], 0
    for n, line in mdtext.prose_lines(text):
        s = line.strip()
        new_item = bool(re.match(r"^([-*+]|\d+[.)]|\|)\s", s)) or s.startswith("|")
        if not s or mdtext.HEADING.match(line) or new_item:
            if cur:
                blocks.append((start, " ".join(cur)))
            cur = []
            if not s or mdtext.HEADING.match(line):
                continue
        if not cur:
            start = n
        cur.append(s)
    if cur:
        blocks.append((start, " ".join(cur)))
    out = []
    for n, b in blocks:
        protected = re.sub(r"\b(e\.g|i\.e|vs|etc)\.", lambda m: m.group(0).replace(".", "\0"), b)
        for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[*\"])", protected):
            out.append((n, s.replace("\0", ".")))
    return out


def claims(root):
    """[(file, line, sentence, word)] of every sentence that uses one of the words."""
    out = []
    for doc in mdtext.markdown_files(root, excluded):
        with open(os.path.join(root, doc), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for n, s in sentences(text):
            m = WORDS.search(mdtext.strip_code_spans(s))
            if m:
                out.append((doc, n, s, m.group(1)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=mdtext.repo_root())
    ap.add_argument("--list", action="store_true", help="print every claim found")
    ap.add_argument("--kvrouter", help="ignored (CTest passes it to every script test)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    found = claims(root)
    bad, used = [], set()
    for doc, n, s, word in found:
        if args.list:
            print("%s:%d: [%s] %s" % (doc, n, word, s))
        hits = [i for i, e in enumerate(ALLOWLIST) if e["file"] == doc and e["needle"] in s]
        if not hits:
            bad.append("%s:%d: says %r and is not in tests/docs/test_not_done.py's ALLOWLIST "
                       "(add it with the evidence that it holds): %s" % (doc, n, word, s))
        used.update(hits)
    for i, e in enumerate(ALLOWLIST):
        if i not in used:
            bad.append("ALLOWLIST entry %s: %r matches no sentence any more: remove it"
                       % (e["file"], e["needle"]))
            continue
        for ev in e["evidence"]:
            why = ev.check(root)
            if why:
                bad.append("%s: %r no longer holds (%s): %s" % (e["file"], e["needle"], e["why"], why))
    for line in bad:
        print("FAIL " + line)
    print("%d sentences say not done / pending / missing / not yet / TODO; %d allowlist entries; "
          "%d problems" % (len(found), len(ALLOWLIST), len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
