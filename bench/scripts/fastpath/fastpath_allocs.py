#!/usr/bin/env python3
"""fastpath_allocs.py -- who calls malloc/calloc/realloc in kvrouter, from `perf script` output.

Experiment fastpath (bench/results/fastpath/): prints a Markdown table, which fastpath.sh --perf
keeps as OUT/raw/alloc_sites_small.md; writes no file itself.

bench/scripts/fastpath/fastpath.sh --perf records every call of libc's malloc, calloc and realloc in
the
router (uprobes from `perf probe`, `perf record --call-graph dwarf`) during a short small-POST cell,
then pipes `perf script -F event,ip,sym,dso` into this script with the cell's request count.

Each sample is one allocation call with its call chain. The chain is read from the innermost frame
outwards, skipping libc and the project's own thin wrappers (kvr_x*, kvr_buf_*), to the first frame
that decided to allocate: its library says whose allocation it is (libcurl, cJSON, kvrouter), and
the innermost three kvrouter frames say on which path of the router it happened (kvrouter's frames
are those of the executable, whatever its file is called: a copy such as /tmp/kvr_fp10 included).
Prints the calls recorded per request by library and the top call sites as a Markdown table. perf
record drops samples when its buffer fills (dwarf stacks are large), so the shares are the figure
here, not the count: the exact count per request is fastpath.sh's `perf stat` of the same probes
(raw/allocs_<cell>.txt).

usage: perf script -i allocs.data -F event,ip,sym,dso | fastpath_allocs.py REQUESTS [TOP]
"""
import collections
import sys


def is_wrapper(sym, dso):
    """Frames that only pass an allocation on: libc itself, inlined libc entry points, kvr_x*()
    and kvr_buf_*()."""
    return ("libc.so" in dso or dso == "inlined" or sym.startswith("__GI___libc")
            or sym.startswith("kvr_x") or sym.startswith("kvr_buf_"))


def is_main(dso):
    """The executable's frames: a file that is not a shared object ([unknown], [kernel] are not
    files)."""
    return not dso.startswith("[") and ".so" not in dso.rsplit("/", 1)[-1]


def lib_name(dso):
    if is_main(dso):
        return "kvrouter"
    name = dso.rsplit("/", 1)[-1]
    return name.split(".so")[0] if ".so" in name else name


def samples(lines):
    """Yields each sample's frames as (symbol, dso) pairs, innermost first."""
    frames, started = [], False
    for line in lines:
        if not line.strip():
            if started:
                yield frames
            frames, started = [], False
            continue
        if not line.startswith("\t"):  # the sample's header line (frames start with a tab)
            if started:
                yield frames
            frames, started = [], True
            continue
        parts = line.strip().split(None, 1)
        if len(parts) == 2:
            sym, _, dso = parts[1].rpartition(" (")
            frames.append((sym.split("+0x")[0], dso.rstrip(")")))
    if started:
        yield frames


def main():
    if len(sys.argv) not in (2, 3) or not sys.argv[1].isdigit() or int(sys.argv[1]) == 0:
        sys.exit("usage: perf script ... | fastpath_allocs.py REQUESTS [TOP]")
    requests = int(sys.argv[1])
    top = int(sys.argv[2]) if len(sys.argv) == 3 else 25
    by_lib, by_site = collections.Counter(), collections.Counter()
    n = 0
    for frames in samples(sys.stdin):
        n += 1
        real = [f for f in frames if not is_wrapper(*f)]
        sym, dso = real[0] if real else ("?", "?")
        by_lib[lib_name(dso)] += 1
        path = " <- ".join(s for s, d in real if is_main(d))
        path = " <- ".join(path.split(" <- ")[:3])
        by_site["`%s` (%s) | %s" % (sym, lib_name(dso), path or "-")] += 1
    if n == 0:
        sys.exit("fastpath_allocs.py: no samples in the perf script output")
    print("%d allocation calls (malloc, calloc, realloc) recorded with their call chains over %d "
          "requests (%.1f per request; perf record drops samples under load, so the shares are the "
          "figure: the exact count per request is raw/allocs_small.txt's)\n"
          % (n, requests, n / requests))
    print("| library of the allocating frame | recorded per request | share |")
    print("|---|---:|---:|")
    for lib, c in by_lib.most_common():
        print("| %s | %.1f | %.1f%% |" % (lib, c / requests, 100.0 * c / n))
    print("\n| allocating frame (library) | innermost kvrouter frames | recorded per request | share |")
    print("|---|---|---:|---:|")
    for site, c in by_site.most_common(top):
        print("| %s | %.1f | %.1f%% |" % (site, c / requests, 100.0 * c / n))


if __name__ == "__main__":
    main()
