#!/usr/bin/env python3
"""fastpath_sse.py -- router CPU per forwarded SSE event: N concurrent streams of M events each.

Experiment fastpath (bench/results/fastpath/): prints one result line, which fastpath.sh keeps in
OUT/raw/sse.jsonl; writes no file itself.

Called by bench/scripts/fastpath/fastpath.sh with a running `kvrouter serve` (its port and PID) in
front of a `kvrouter sim` in fixed-latency mode. Opens --streams keep-alive connections at once
(asyncio, one process), sends each a streaming chat completion with max_tokens --events and
ignore_eos, and reads
every stream to its `data: [DONE]`. The router's CPU time is read from /proc/PID/stat (utime + stime,
clock ticks) just before the requests are written and just after the last stream ends; the result is
events forwarded per router CPU-second.

Counting: an event is a "data: " line other than "data: [DONE]" (the sim writes one JSON chunk per
token). A stream that ends with another status than 200, with fewer events than asked, or without
[DONE] is an error: the script exits non-zero and says which stream failed, so a broken path never
turns into a fast number.

Output: one line "FASTPATH_SSE {json}" with streams, events, router_cpu_s, wall_s, events_per_cpu_s.
"""
import argparse
import asyncio
import json
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of pid in seconds (fields 14 and 15 of /proc/PID/stat, after the comm field)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def body_pieces(reader, headers):
    """Yields the response body as it arrives, undoing chunked transfer coding if present."""
    if b"transfer-encoding: chunked" in headers.lower():
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)  # CRLF after the chunk
    while True:  # Content-Length or read-to-close: the stream ends with [DONE] either way
        piece = await reader.read(65536)
        if not piece:
            return
        yield piece


async def one_stream(port, body, start, idx):
    """Sends one streaming request once start is set; returns (idx, events, done_seen, status)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    await start.wait()
    writer.write(req)
    await writer.drain()
    headers = await reader.readuntil(b"\r\n\r\n")
    parts = headers.split(b" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    events, done, carry = 0, False, b""
    async for piece in body_pieces(reader, headers):
        # Count whole lines only: the partial last line is carried into the next piece.
        data = carry + piece
        cut = data.rfind(b"\n") + 1
        lines, carry = data[:cut], data[cut:]
        events += lines.count(b"data: ")
        if b"data: [DONE]" in lines:
            done = True
            break
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return idx, events - (1 if done else 0), done, status


async def run(args):
    body = json.dumps({"model": args.model, "stream": True, "ignore_eos": True,
                       "max_tokens": args.events,
                       "messages": [{"role": "user", "content": "Tell me a story about a router."}]}
                      ).encode()
    start = asyncio.Event()
    tasks = [asyncio.create_task(one_stream(args.port, body, start, i)) for i in range(args.streams)]
    await asyncio.sleep(0.3)  # let every connection be accepted before the CPU clock starts
    cpu0, t0 = cpu_seconds(args.pid), time.perf_counter()
    start.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=args.timeout)
    cpu1, t1 = cpu_seconds(args.pid), time.perf_counter()
    bad = [r for r in results if r[3] != 200 or not r[2] or r[1] != args.events]
    if bad:
        idx, ev, done, status = bad[0]
        sys.exit("fastpath_sse.py: %d of %d streams failed; stream %d: status %d, %d of %d events, "
                 "[DONE] %s" % (len(bad), len(results), idx, status, ev, args.events,
                                "seen" if done else "missing"))
    events = sum(r[1] for r in results)
    cpu = cpu1 - cpu0
    out = {"streams": args.streams, "events_per_stream": args.events, "events": events,
           "router_cpu_s": round(cpu, 3), "wall_s": round(t1 - t0, 3),
           "events_per_cpu_s": round(events / cpu) if cpu > 0 else None}
    print("FASTPATH_SSE " + json.dumps(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True, help="router's public port")
    ap.add_argument("--pid", type=int, required=True, help="router's PID (CPU time is read from it)")
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--events", type=int, default=2000, help="SSE events (tokens) per stream")
    ap.add_argument("--model", default="meta-llama/Llama-3.3-70B-Instruct")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for all streams")
    args = ap.parse_args()
    if args.streams < 1 or args.events < 1:
        sys.exit("fastpath_sse.py: --streams and --events must be >= 1")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
