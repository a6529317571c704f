#!/usr/bin/env python3
"""A hostile worker behind a real router (issue 37, "Hostile bytes from either side"): one MODE per
malformation of a worker's answer, each with the verdict the router owes its client.

The fake worker (HostileWorker) speaks raw sockets: one listening socket on 127.0.0.1:0, one thread
per accepted connection, every connection numbered. It answers GET /metrics, GET /v1/models and
GET /health sanely (so the router scrapes it and keeps it up), and answers POST
/v1/chat/completions with the bytes of the mode named in the request's x-hostile-mode header (the
router forwards the client's headers). It records, per request, the connection it arrived on, and
per connection whether the router closed it.

Verdicts (what the client, read with a raw socket so every byte of the head is seen, must get):
  502            status 502, OpenAI's error shape {"error": {"message", "type", "code"}} with code
                 upstream_protocol_error; no smuggled header or byte reaches the client;
                 kvrouter_upstream_response_errors_total{reason=R} and
                 kvrouter_request_errors_total{reason="upstream_protocol"} grow by one; the
                 connection the answer came on is closed by the router and never carries another
                 request, and a following well-formed request succeeds on a new connection.
  502-upstream   the head was fine but the body broke before the client response started (the
                 router holds non-streamed bodies): a 502 in the error shape (upstream_error or
                 upstream_protocol_error), then a well-formed request succeeds.
  truncated      a started (streamed) response cut short: an SSE error event in the body, or a
                 body whose framing never completes.
  200-clean      a 200 whose head and body are exactly those a correct worker's answer gets
                 (x-request-id and date aside); interim heads never reach the client.
  200-as-sent    a 200 with a clean head whose body is byte for byte the worker's (de-chunked).
  usage-rejected a 200 with the worker's body, kvrouter_usage_rejected_total grew by one and
                 kvrouter_prompt_tokens_total neither went backwards nor jumped by more than 2^32.
Verdicts the issue does not fix and this file chooses: a stream without [DONE] or with garbage
lines passes through as sent (the router cannot take back what it already streamed); an event after
[DONE] is not forwarded (200-clean: the stream a correct worker's gets); a gzip body the router did
not ask for is documented as passed through (200-as-sent: the client gets the gzip bytes with their
Content-Encoding); 200 KiB of response headers is refused (502-upstream: the router bounds a
client's head at 32 KiB and should not hand a client an unbounded one).
The baselines of 200-clean are the router's answers to a correct worker's JSON and SSE answers,
taken first (test_control checks them).

At the end the table (mode, expected, got, ok) is printed. Exit 77 when a module is missing.

Run:  python3 tests/router/test_hostile_worker.py --kvrouter build/kvrouter [-k group] [-v]
"""
import os
import sys

try:
    import gzip
    import json
    import re
    import socket
    import threading
    import time
except ImportError as e:  # a stripped Python: the test cannot run
    print("SKIP test_hostile_worker: %s" % e)
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
try:
    import kvrharness as h  # noqa: E402
except ImportError as e:
    print("SKIP test_hostile_worker: %s" % e)
    sys.exit(77)

MODEL = h.MODEL
CRLF = b"\r\n"
U32 = 1 << 32

# ---- what the worker sends -----------------------------------------------------------------------

STD = [b"date: Sat, 29 Nov 2026 05:00:00 GMT", b"server: uvicorn"]


def head(status, fields):
    """A response head: the status line (what follows "HTTP/1.1 ", or after a "!" a whole line of
    another protocol) and field lines, each ended by CRLF unless it already ends in LF."""
    line = status[1:] if status.startswith(b"!") else b"HTTP/1.1 " + status
    out = line + CRLF
    for f in fields:
        out += f if f.endswith(b"\n") else f + CRLF
    return out + CRLF


def chat_json(usage=b'{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}'):
    return (b'{"id":"chatcmpl-hostile","object":"chat.completion","created":1764392400,"model":"'
            + MODEL.encode() + b'","choices":[{"index":0,"message":{"role":"assistant","content":'
            b'"Hello world"},"logprobs":null,"finish_reason":"stop"}],"usage":' + usage + b"}")


def sse_events(usage=b'{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}', done=True):
    """vLLM's chat stream with include_usage: role, two tokens, finish, usage, [DONE]."""
    pre = b'{"id":"chatcmpl-hostile","object":"chat.completion.chunk","created":1764392400,"model":"' \
        + MODEL.encode() + b'",'
    ev = [pre + b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
          pre + b'"choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}',
          pre + b'"choices":[{"index":0,"delta":{"content":" world"},"finish_reason":null}]}',
          pre + b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}']
    if usage is not None:
        ev.append(pre + b'"choices":[],"usage":' + usage + b"}")
    out = [b"data: " + e + b"\n\n" for e in ev]
    if done:
        out.append(b"data: [DONE]\n\n")
    return out


def chunk(data):
    return b"%x\r\n" % len(data) + data + CRLF


def JSON_FIELDS(body):
    return STD + [b"content-length: %d" % len(body), b"content-type: application/json"]


SSE_FIELDS = STD + [b"content-type: text/event-stream; charset=utf-8", b"transfer-encoding: chunked"]


def json_answer(extra=(), body=None, status=b"200 OK", fields=None):
    """A non-streamed answer: the standard fields with extra lines inserted before content-type."""
    body = chat_json() if body is None else body
    f = list(JSON_FIELDS(body)) if fields is None else list(fields)
    f[3:3] = list(extra)
    return [head(status, f) + body]


def sse_answer(events=None, extra=(), tail=b"0\r\n\r\n"):
    """A streamed answer, one chunk per event (sent as separate writes), then tail."""
    events = sse_events() if events is None else events
    return [head(b"200 OK", SSE_FIELDS[:3] + list(extra) + SSE_FIELDS[3:])] + \
        [chunk(e) for e in events] + ([tail] if tail else [])


GOOD_JSON = chat_json()
GOOD_SSE = b"".join(sse_events())

# ---- the modes -------------------------------------------------------------------------------------
# name, group (one test each), expected verdict, pieces (the worker's bytes, written separately),
# after ("keep" the connection open for more requests, or "close" it), stream (the client asks for
# SSE), reason (the checker's reason for a 502), body (what the client must get for 200-as-sent and
# usage-rejected).

MODES = []


def mode(name, group, expected, pieces, after="keep", stream=False, reason=None, body=None):
    MODES.append(dict(name=name, group=group, expected=expected, pieces=pieces, after=after,
                      stream=stream, reason=reason, body=body))


# Controls: what a correct worker's answers become (the baselines of 200-clean).
mode("good_json", "control", "200-clean", json_answer())
mode("good_sse", "control", "200-clean", sse_answer(), stream=True)

# Header injection: a bare CR splits a line for a client that reads CR as a line end; libcurl
# splits at LF only and would hand the whole line to the proxy as one field.
for nm, smuggled in [("te", b"Transfer-Encoding: chunked"), ("cl", b"Content-Length: 0"),
                     ("worker", b"x-kvrouter-worker: smuggled"), ("cookie", b"Set-Cookie: smuggled=1")]:
    mode("cr_smuggle_" + nm, "headers", "502", json_answer([b"X-Note: a\r" + smuggled]),
         reason="header_value")
mode("cr_smuggle_cookie_sse", "headers", "502", sse_answer(extra=[b"X-Note: a\rSet-Cookie: smuggled=1"]),
     stream=True, reason="header_value")
mode("cr_end_of_value", "headers", "502", json_answer([b"X-Note: a\r\r\n"]), reason="header_value")
# libcurl refuses a NUL in a head before the proxy's checker sees the line: "malformed".
mode("nul_in_value", "headers", "502", json_answer([b"X-Note: a\x00smuggled"]), reason="malformed")
mode("soh_in_value", "headers", "502", json_answer([b"X-Note: a\x01b"]), reason="header_value")
mode("esc_in_value", "headers", "502", json_answer([b"X-Note: \x1b[31msmuggled\x1b[0m"]),
     reason="header_value")
mode("del_in_value", "headers", "502", json_answer([b"X-Note: a\x7fb"]), reason="header_value")
mode("obs_fold", "headers", "502", json_answer([b"X-Note: a", b" Set-Cookie: smuggled=1"]),
     reason="obs_fold")
mode("name_with_space", "headers", "502", json_answer([b"Bad Name: smuggled"]), reason="header_name")
mode("name_with_parens", "headers", "502", json_answer([b"X(y): smuggled"]), reason="header_name")
mode("name_empty", "headers", "502", json_answer([b": smuggled"]), reason="header_name")

# Framing conflicts in the head (502), and broken body framing after a good head.
_b = GOOD_JSON
mode("cl_two_values", "framing", "502",
     json_answer(fields=STD + [b"content-length: %d" % len(_b), b"content-length: %d" % (len(_b) + 1),
                               b"content-type: application/json"], body=_b + b" "),
     reason="content_length")
mode("cl_not_a_number", "framing", "502",
     json_answer(fields=STD + [b"content-length: %dabc" % len(_b), b"content-type: application/json"]),
     after="close", reason="content_length")
mode("cl_list_differs", "framing", "502",
     json_answer(fields=STD + [b"content-length: %d, %d" % (len(_b), len(_b) + 1),
                               b"content-type: application/json"]),
     after="close", reason="content_length")
mode("cl_empty_second", "framing", "502",
     json_answer(fields=STD + [b"content-length: %d" % len(_b), b"content-length: ",
                               b"content-type: application/json"]),
     reason="malformed")  # libcurl refuses the empty second value first
mode("te_chunked_and_cl", "framing", "502",
     [head(b"200 OK", STD + [b"content-type: application/json", b"transfer-encoding: chunked",
                             b"content-length: %d" % len(_b)]) + chunk(_b) + b"0\r\n\r\n"],
     reason="te_and_cl")
_chunked_json_head = head(b"200 OK", STD + [b"content-type: application/json", b"transfer-encoding: chunked"])
mode("chunk_size_zz", "framing", "502-upstream",
     [_chunked_json_head + chunk(_b[:40]) + b"zz\r\n" + _b[40:] + b"\r\n0\r\n\r\n"], after="close")
mode("chunk_size_zz_sse", "framing", "truncated",
     sse_answer(sse_events()[:2], tail=b"zz\r\n" + b"data: x\n\n\r\n0\r\n\r\n"), after="close",
     stream=True)
mode("chunk_size_overflow", "framing", "502-upstream",
     [_chunked_json_head + chunk(_b[:40]) + b"ffffffffffffffffff1\r\n" + _b[40:] + b"\r\n0\r\n\r\n"],
     after="close")
mode("chunk_size_overflow_sse", "framing", "truncated",
     sse_answer(sse_events()[:2], tail=b"10000000000000000\r\ndata: x\n\n"), after="close",
     stream=True)
mode("early_close", "framing", "502-upstream",
     [head(b"200 OK", JSON_FIELDS(_b)) + _b[:len(_b) // 2]], after="close")
mode("early_close_sse", "framing", "truncated", sse_answer(sse_events()[:3], tail=None),
     after="close", stream=True)

# Absurd usage, in a non-streamed body and in the stream's usage chunk.
for nm, u in [("1e300", b'{"prompt_tokens":1e300,"completion_tokens":2,"total_tokens":9}'),
              ("u64max", b'{"prompt_tokens":18446744073709551615,"completion_tokens":2,"total_tokens":9}'),
              ("negative", b'{"prompt_tokens":-5,"completion_tokens":2,"total_tokens":9}'),
              ("fraction", b'{"prompt_tokens":1.5,"completion_tokens":2,"total_tokens":9}'),
              ("cached_gt_prompt", b'{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12,'
                                   b'"prompt_tokens_details":{"cached_tokens":20}}')]:
    mode("usage_%s_json" % nm, "usage", "usage-rejected", json_answer(body=chat_json(u)),
         body=chat_json(u))
    mode("usage_%s_sse" % nm, "usage", "usage-rejected", sse_answer(sse_events(u)), stream=True,
         body=b"".join(sse_events(u)))

# Broken SSE: no [DONE] and garbage lines pass through as sent (the router cannot take back what it
# streamed; it must survive them); what comes after [DONE] is not forwarded (the stream ends there).
_no_done = sse_events(done=False)
mode("sse_no_done", "sse", "200-as-sent", sse_answer(_no_done), stream=True, body=b"".join(_no_done))
_garbage = sse_events()[:2] + [b"data: {not json\n\n", b"\x00\xff garbage line\n\n", b": comment\n\n",
                               b"event: weird\ndata: [DONE] extra\n\n", b"data:\n\n"] + sse_events()[2:]
mode("sse_garbage_lines", "sse", "200-as-sent", sse_answer(_garbage), stream=True,
     body=b"".join(_garbage))
_after = sse_events() + sse_events()[1:2]
mode("sse_event_after_done", "sse", "200-clean", sse_answer(_after), stream=True)

# A gzip body the router never asked for (it drops the client's Accept-Encoding upstream).
_gz = gzip.compress(GOOD_JSON, mtime=0)
mode("gzip_body", "gzip", "200-as-sent",
     json_answer(body=_gz, fields=STD + [b"content-length: %d" % len(_gz), b"content-encoding: gzip",
                                          b"content-type: application/json"]), body=_gz)

# Interim heads: consumed, never forwarded; 101 and a 1xx alone are errors.
mode("interim_100_then_200", "interim", "200-clean", [head(b"100 Continue", [])] + json_answer())
mode("interim_102_then_200", "interim", "200-clean", [head(b"102 Processing", [])] + json_answer())
mode("interim_103_then_200", "interim", "200-clean",
     [head(b"103 Early Hints", [b"Link: </smuggled.css>; rel=preload"])] + json_answer())
mode("switching_101", "interim", "502",
     [head(b"101 Switching Protocols", [b"Upgrade: websocket", b"Connection: Upgrade"]) + b"\x81\x05hello"],
     after="close", reason="switching")
mode("interim_then_close", "interim", "502", [head(b"100 Continue", [])], after="close",
     reason="interim_only")

# Final status out of range, and status lines that are not HTTP's.
# A status below 100, or a status line that is not HTTP's, libcurl refuses before the proxy's
# checker sees it ("malformed"); the checker's own reasons cover what libcurl lets through.
for code, reason in [(b"099", "malformed"), (b"600", "status_code"), (b"999", "status_code"),
                     (b"abc", "malformed")]:
    mode("status_" + code.decode(), "status", "502", json_answer(status=code + b" Odd"), reason=reason)
mode("status_line_no_space", "status", "502", json_answer(status=b"200OK"), reason="status_line")
mode("status_line_bare_cr", "status", "502", json_answer(status=b"200 OK\rSet-Cookie: smuggled=1"),
     reason="status_line")
mode("status_line_icy", "status", "502", json_answer(status=b"!ICY 200 OK"), reason="malformed")

# 200 KiB of headers: as many ~100-byte fields, and one field of 200 KiB.
# Many fields: the proxy's bound (64 KiB, 200 fields: KVR_HTTP_RESP_HEAD_MAX); one 200 KiB field:
# libcurl's own (CURL_MAX_HTTP_HEADER, 100 KiB).
mode("huge_headers_many", "huge", "502",
     json_answer([b"X-Pad-%04d: %s" % (i, b"p" * 90) for i in range(2000)]), reason="head_size")
mode("huge_header_one", "huge", "502-upstream", json_answer([b"X-Pad: " + b"p" * (200 << 10)]))

# ---- the worker ------------------------------------------------------------------------------------

METRICS_PAGE = (b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="%s"} 0\n'
                b'# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="%s"} 0\n'
                b'# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="%s"} 0.0\n'
                % ((MODEL.encode(),) * 3))
MODELS_BODY = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0,
                                                      "owned_by": "vllm", "root": MODEL,
                                                      "max_model_len": 8192}]}).encode()


def ok_answer(ctype, body):
    return head(b"200 OK", STD + [b"content-length: %d" % len(body), b"content-type: " + ctype]) + body


class HostileWorker:
    """Raw-socket fake vLLM worker; see the module docstring. Attributes: port, url; requests
    [(conn id, method, path, mode)]; closed_by_router {conn id: True} once the router closed it."""

    def __init__(self):
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.lock = threading.Lock()
        self.nconn = 0
        self.requests = []
        self.closed_by_router = {}
        self.conns = []
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def kill(self):  # Cleanup protocol
        self.stopping = True
        self.thread.join(2.0)
        self.lsock.close()
        with self.lock:
            for s in self.conns:
                try:
                    s.close()
                except OSError:
                    pass

    def _accept(self):
        while not self.stopping:
            try:
                s, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                self.nconn += 1
                cid = self.nconn
                self.conns.append(s)
            threading.Thread(target=self._serve, args=(s, cid), daemon=True).start()

    def _read_request(self, s, buf):
        """(method, path, headers dict, body, rest of buf), or None at EOF."""
        while b"\r\n\r\n" not in buf:
            d = s.recv(65536)
            if not d:
                return None
            buf += d
        i = buf.index(b"\r\n\r\n")
        lines = buf[:i].decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        hdrs = {}
        for ln in lines[1:]:
            n, _, v = ln.partition(":")
            hdrs[n.strip().lower()] = v.strip()
        rest = buf[i + 4:]
        n = int(hdrs.get("content-length") or 0)
        while len(rest) < n:
            d = s.recv(65536)
            if not d:
                return None
            rest += d
        return method, path, hdrs, rest[:n], rest[n:]

    def _serve(self, s, cid):
        s.settimeout(30.0)
        buf = b""
        try:
            while not self.stopping:
                req = self._read_request(s, buf)
                if req is None:
                    with self.lock:
                        self.closed_by_router[cid] = True
                    return
                method, path, hdrs, body, buf = req
                m = hdrs.get("x-hostile-mode", "good_json")
                with self.lock:
                    self.requests.append((cid, method, path, m))
                if path == "/metrics":
                    s.sendall(ok_answer(b"text/plain; version=0.0.4", METRICS_PAGE))
                elif path.startswith("/v1/models"):
                    s.sendall(ok_answer(b"application/json", MODELS_BODY))
                elif path == "/health":
                    s.sendall(head(b"200 OK", STD + [b"content-length: 0"]))
                else:
                    md = BY_NAME.get(m) or BY_NAME["good_json"]
                    for i, piece in enumerate(md["pieces"]):
                        if i:
                            time.sleep(0.02)  # separate deliveries: a stream starts before it breaks
                        s.sendall(piece)
                    if md["after"] == "close":
                        time.sleep(0.02)
                        return
        except OSError:  # reset or broken pipe: the router closed it while the worker wrote
            with self.lock:
                self.closed_by_router[cid] = True
            return
        finally:
            try:
                s.close()
            except OSError:
                pass

    def last(self, mode_name):
        """(connection, index in requests) of the last request of this mode, or (None, None)."""
        with self.lock:
            for i in range(len(self.requests) - 1, -1, -1):
                if self.requests[i][3] == mode_name:
                    return self.requests[i][0], i
        return None, None

    def later_on(self, cid, index):
        """The requests that arrived on connection cid after requests[index]."""
        with self.lock:
            return [r for r in self.requests[index + 1:] if r[0] == cid]


BY_NAME = {m["name"]: m for m in MODES}

# ---- the client: raw socket, every head byte kept ------------------------------------------------


class Answer:
    def __init__(self):
        self.raw_heads = []  # every head the client got, raw (interim ones included)
        self.status = 0
        self.head = b""
        self.fields = []  # [(lower-case name, value)] of the final head, split at CRLF
        self.body = b""
        self.complete = False
        self.error = None  # "timeout", "eof before a status", ...

    def field(self, name):
        return [v for n, v in self.fields if n == name]


def ask(port, mode_name, stream=False, timeout=6.0):
    """One request on a fresh client connection, read raw. Never raises on the peer's behaviour."""
    body = h.chat_body(stream=stream, content="hostile worker test: " + mode_name)
    if stream:
        body["stream_options"] = {"include_usage": True}
    a = Answer()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    deadline = time.monotonic() + timeout
    buf = bytearray()

    def fill():
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        s.settimeout(left)
        d = s.recv(65536)
        if not d:
            raise EOFError()
        buf.extend(d)

    try:
        s.sendall(h.build_request("POST", "/v1/chat/completions", body,
                                  [("x-hostile-mode", mode_name)]))
        while True:  # heads (interim ones too)
            while b"\r\n\r\n" not in buf:
                if len(buf) > (1 << 20):
                    a.error = "head over 1 MiB"
                    return a
                fill()
            i = buf.index(b"\r\n\r\n") + 4
            raw = bytes(buf[:i])
            del buf[:i]
            a.raw_heads.append(raw)
            m = re.match(rb"HTTP/1\.[01] (\d{3})", raw)
            a.status = int(m.group(1)) if m else -1
            if not (100 <= a.status < 200):
                break
        a.head = raw
        for ln in raw[:-4].split(b"\r\n")[1:]:
            n, _, v = ln.partition(b":")
            a.fields.append((n.decode("latin-1").strip().lower(), v.strip().decode("latin-1")))
        te = ",".join(a.field("transfer-encoding")).lower()
        cl = a.field("content-length")
        if "chunked" in te:
            out = bytearray()
            while True:
                while b"\r\n" not in buf:
                    fill()
                j = buf.index(b"\r\n")
                size = int(bytes(buf[:j]).split(b";")[0], 16)
                del buf[:j + 2]
                while len(buf) < size + 2:
                    fill()
                out += buf[:size]
                del buf[:size + 2]
                if size == 0:
                    a.complete = True
                    break
                a.body = bytes(out)
            a.body = bytes(out)
        elif cl:
            n = int(cl[0])
            while len(buf) < n:
                fill()
            a.body = bytes(buf[:n])
            a.complete = True
        else:
            try:
                while True:
                    fill()
            except EOFError:
                a.body = bytes(buf)
                a.complete = True
    except socket.timeout:
        a.error = a.error or "timeout"
        a.body = a.body or bytes(buf)
    except EOFError:
        a.error = "eof" if a.status else "eof before a status"
    except (OSError, ValueError) as e:
        a.error = "%s: %s" % (type(e).__name__, e)
    finally:
        s.close()
    return a


TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def head_anomalies(a):
    """What a strict client would object to in the heads it got (empty list: clean)."""
    out = []
    for raw in a.raw_heads:
        if 100 <= (int(raw[9:12]) if raw[9:12].isdigit() else 0) < 200:
            out.append("1xx forwarded")
    body = a.head[:-4]
    if re.search(rb"\r(?!\n)", body):
        out.append("bare CR")
    if re.search(rb"(?<!\r)\n", body):
        out.append("bare LF")
    if re.search(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", body):
        out.append("CTL byte")
    lines = body.split(b"\r\n")
    for ln in lines[1:]:
        if ln[:1] in (b" ", b"\t"):
            out.append("obs-fold line")
        elif b":" not in ln or not TOKEN.match(ln.split(b":", 1)[0]):
            out.append("bad name %r" % ln[:24])
    if b"smuggled" in a.head:
        # after splitting at CR too (a lenient client's view), which header came through
        for ln in re.split(rb"\r\n|\r|\n", body):
            if b"smuggled" in ln:
                out.append("smuggled %r" % ln[:40])
    if len(a.field("content-length")) > 1:
        out.append("two content-length")
    if a.field("content-length") and a.field("transfer-encoding"):
        out.append("te+cl")
    if len(a.head) > 32 << 10:
        out.append("%d KiB head" % (len(a.head) >> 10))
    if len(a.field("x-kvrouter-worker")) > 1:
        out.append("two x-kvrouter-worker")
    return sorted(set(out))


def norm_fields(a):
    return [(n, v) for n, v in a.fields if n not in ("x-request-id", "date")]


def error_message(a):
    try:
        return str(json.loads(a.body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return ""


def grown(before, after, name, label):
    """The values of label whose name{label=...} samples grew (sorted)."""
    out = set()
    for (n, ls), v in after.items():
        if n == name:
            lab = dict(ls).get(label)
            if lab is not None and v > before.get((n, ls), 0):
                out.add(lab)
    return sorted(out)


def error_code(a):
    try:
        err = json.loads(a.body)["error"]
        if isinstance(err.get("message"), str) and isinstance(err.get("type"), str) and "code" in err:
            return str(err["code"])
        return "bad-error-shape"
    except (ValueError, KeyError, TypeError):
        return "not-json"


def sse_error_event(body):
    return any('"error"' in e for e in h.sse_events(body) if e != "[DONE]")


# ---- the run ---------------------------------------------------------------------------------------

ROWS = []  # (mode, expected, got, ok)
STATE = {}


def metric(samples, name, **labels):
    try:
        return h.prom_value(samples, name, **labels)
    except AssertionError:
        return None


def delta(before, after, name, **labels):
    b, a = metric(before, name, **labels), metric(after, name, **labels)
    if a is None:
        return None
    return a - (b or 0)


def run_mode(md):
    r, w = STATE["router"], STATE["worker"]
    before = h.parse_prom_samples(r.metrics_text())
    a = ask(r.port, md["name"], stream=md["stream"])
    time.sleep(0.05)
    after = h.parse_prom_samples(r.metrics_text())
    exp = md["expected"]
    notes, ok = [], True
    anomalies = head_anomalies(a) if a.status > 0 else []

    # What happened, in words.
    if a.status <= 0:
        got = "no answer (%s)" % a.error
    elif a.status == 502 or a.status == 503:
        got = "%d %s" % (a.status, error_code(a))
    elif a.status == 200:
        sse = "text/event-stream" in ",".join(a.field("content-type"))
        if a.error or not a.complete:
            got = "truncated (%s)" % (a.error or "cut")
        elif sse and sse_error_event(a.body):
            got = "truncated (SSE error event)"
        else:
            base = STATE.get("baseline_sse" if sse else "baseline_json")
            clean = base and norm_fields(a) == base[0] and a.body == base[1]
            if clean and not anomalies:
                got = "200-clean"
            elif md["body"] is not None and a.body == md["body"] and not anomalies:
                got = "200-as-sent"
            elif not anomalies:
                ev = h.sse_events(a.body) if sse else []
                late = len(ev) - ev.index("[DONE]") - 1 if "[DONE]" in ev else 0
                if late:
                    got = "200 (%d events after [DONE] forwarded)" % late
                elif base and a.body == base[1]:
                    extra = sorted({n for n, _ in norm_fields(a)} ^ {n for n, _ in base[0]})
                    got = "200 (head differs: %s)" % (",".join(extra) or "values")
                else:
                    got = "200 (body differs)"
            else:
                got = "200"
    else:
        got = "%d" % a.status
    if anomalies:
        got += " [%s]" % "; ".join(anomalies)

    # The verdict's checks.
    if exp == "502":
        ok = a.status == 502 and error_code(a) == "upstream_protocol_error" and not anomalies
        d = delta(before, after, "kvrouter_upstream_response_errors_total", reason=md["reason"])
        dp = delta(before, after, "kvrouter_request_errors_total", reason="upstream_protocol")
        if d != 1:
            notes.append("%s %s" % (md["reason"], "+%g" % d if d is not None else "absent"))
            ok = False
        if dp != 1:
            notes.append("upstream_protocol %s" % ("+%g" % dp if dp is not None else "absent"))
            ok = False
        if not ok:
            notes.append("request_errors grew: %s" % ",".join(
                grown(before, after, "kvrouter_request_errors_total", "reason")))
            if a.status == 502:
                notes.append("message %r" % error_message(a)[:70])
    elif exp == "502-upstream":
        ok = a.status == 502 and error_code(a) in ("upstream_error", "upstream_protocol_error") \
            and not anomalies
    elif exp == "truncated":
        ok = a.status == 200 and got.startswith("truncated") and not anomalies
    elif exp == "200-clean":
        ok = got == "200-clean"
    elif exp == "200-as-sent":
        ok = got in ("200-as-sent", "200-clean")
    elif exp == "usage-rejected":
        dr = delta(before, after, "kvrouter_usage_rejected_total")
        dpt = delta(before, after, "kvrouter_prompt_tokens_total")
        good = a.status == 200 and got in ("200-as-sent", "200-clean")
        if good:
            got = "200"
        got += ", usage_rejected %s" % ("+%g" % dr if dr is not None else "absent")
        if dpt is None or dpt < 0 or dpt > U32:
            got += ", prompt_tokens_total %s" % ("%+g" % dpt if dpt is not None else "absent")
        ok = good and dr == 1 and dpt is not None and 0 <= dpt <= U32
        if ok:
            got = "200 + usage rejected"

    # After a 502: the worker's connection is not reused and a good request still works.
    if exp in ("502", "502-upstream"):
        cid, idx = w.last(md["name"])
        follow = ask(r.port, "good_json")
        fcid, _ = w.last("good_json")
        if follow.status != 200 or norm_fields(follow) != STATE["baseline_json"][0]:
            notes.append("follow-up %d %s" % (follow.status, follow.error or ""))
            ok = False
        if cid is None:
            notes.append("worker never asked")
            ok = False
        else:
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline and not w.closed_by_router.get(cid) \
                    and md["after"] == "keep":
                time.sleep(0.02)
            reused = w.later_on(cid, idx)
            if reused or fcid == cid:
                notes.append("conn reused by %s" % ", ".join(sorted({p for _, _, p, _ in reused})))
                ok = False
            elif md["after"] == "keep" and not w.closed_by_router.get(cid):
                notes.append("conn kept open")
                ok = False
    if md["name"] == "gzip_body" and a.status == 200:
        try:
            notes.append("gunzips to the JSON: %s" % (gzip.decompress(a.body) == GOOD_JSON))
        except OSError:
            notes.append("not gzip")
        notes.append("content-encoding %r" % ",".join(a.field("content-encoding")))
    if notes:
        got += " (%s)" % ", ".join(notes)
    ROWS.append((md["name"], exp, got, ok))
    if not r.alive():
        raise AssertionError("the router died on mode %s" % md["name"])
    return ok


TESTS, test = h.registry()


def run_group(group):
    bad = [md["name"] for md in MODES if md["group"] == group and not run_mode(md)]
    assert not bad, "%d modes not as expected: %s" % (len(bad), ", ".join(bad))


class Shared:
    """One worker and one router for every group (started once: the whole file stays short)."""

    def around(self):
        import contextlib

        @contextlib.contextmanager
        def cm():
            with h.Cleanup() as c:
                w = c.add(HostileWorker())
                r = c.add(h.Router([w], "--policy", "round_robin", "--connect-timeout-ms", "500",
                                   "--first-byte-timeout-ms", "2000", "--idle-timeout-ms", "2000",
                                   "--outlier-consecutive-failures", "0", "--fail-threshold", "1000",
                                   "--access-log", "false"))
                STATE.update(router=r, worker=w)
                h.wait_for(lambda: h.request(r.port, "GET", "/health").status == 200, 5.0,
                           "the hostile worker to be up")
                # Baselines: what a correct worker's answers look like through the router.
                for kind, nm, stream in (("json", "good_json", False), ("sse", "good_sse", True)):
                    a = ask(r.port, nm, stream=stream)
                    assert a.status == 200 and a.complete, (nm, a.status, a.error)
                    STATE["baseline_" + kind] = (norm_fields(a), a.body)
                assert STATE["baseline_json"][1] == GOOD_JSON, STATE["baseline_json"][1][:200]
                assert STATE["baseline_sse"][1] == GOOD_SSE, STATE["baseline_sse"][1][:200]
                yield
        return cm()


SHARED = Shared()


@test(timeout=20)
def test_control():
    """A correct worker's JSON and SSE answers come through clean (the baselines agree)."""
    run_group("control")


@test(timeout=40)
def test_header_injection():
    """Bare CR smuggling TE, CL, x-kvrouter-worker, Set-Cookie; CR at the end; NUL, SOH, ESC, DEL;
    obs-fold; names that are not tokens: each a 502 upstream_protocol_error, nothing smuggled,
    the worker's connection closed and a following request fine."""
    run_group("headers")


@test(timeout=40)
def test_framing():
    """Two Content-Lengths, a non-numeric one, TE with CL: 502; bad or overflowing chunk sizes and
    an early close: a clean 502 for a held body, a truncated stream for SSE."""
    run_group("framing")


@test(timeout=30)
def test_absurd_usage():
    """Usage 1e300, 2^64-1, -5, 1.5, cached > prompt (JSON and SSE): the answer passes, its usage
    is refused (kvrouter_usage_rejected_total), kvrouter_prompt_tokens_total never goes back."""
    run_group("usage")


@test(timeout=20)
def test_broken_sse():
    """No [DONE], garbage lines: passed through as sent; an event after [DONE]: not forwarded."""
    run_group("sse")


@test(timeout=20)
def test_gzip_body():
    """A gzip body the router did not ask for: passed through (documented in the table)."""
    run_group("gzip")


@test(timeout=30)
def test_interim_heads():
    """100, 102, 103 then 200: consumed (the client sees only the 200); 101 and a lone 1xx: 502."""
    run_group("interim")


@test(timeout=30)
def test_status_lines():
    """Final status 099, 600, 999, abc, and malformed status lines: 502 upstream_protocol_error."""
    run_group("status")


@test(timeout=30)
def test_huge_headers():
    """200 KiB of response headers (many fields, or one): refused with a 502."""
    run_group("huge")


def print_table():
    if not ROWS:
        return
    w1 = max(len(r[0]) for r in ROWS)
    w2 = max(len(r[1]) for r in ROWS)
    print("\n| %-*s | %-*s | %s | ok |" % (w1, "mode", w2, "expected", "got"))
    print("|%s|%s|---|----|" % ("-" * (w1 + 2), "-" * (w2 + 2)))
    for name, exp, got, ok in ROWS:
        print("| %-*s | %-*s | %s | %s |" % (w1, name, w2, exp, got, "yes" if ok else "NO"))
    print("%d of %d modes as expected" % (sum(1 for r in ROWS if r[3]), len(ROWS)))


if __name__ == "__main__":
    rc = h.run(TESTS, description=__doc__, around=SHARED.around)
    print_table()
    sys.exit(rc)
