#!/usr/bin/env python3
"""Streams that survive a dying worker (issue 36): when a chat or completions stream breaks after
its client got tokens, the router continues the answer on another worker (chat: the messages plus
the partial assistant message with continue_final_message true and add_generation_prompt false, as
vLLM continues one; completions: the prompt plus the text so far; max_tokens less what was sent)
and splices the continuation into the client's one stream: one id, one role chunk, usage whose
tokens add up, the last finish_reason and [DONE]. Not resumed: a tool call in flight, n > 1, the
switch off; with no other worker, or past --resume-max, the stream ends with the error event naming
why it broke and why it was not continued. A continuation avoids only the workers that failed since
the latest break (a worker the request tried before it may take the answer again); the retry budget
does not refuse continuations.

The workers here are raw-socket stand-ins that break on cue (a real `kvrouter sim` killed
mid-stream is the chaos soak's case, tests/router/test_chaos.py): the first streamed answer over
the workers of one Breaks sends a role chunk and three tokens, then the connection goes mid-body;
the others answer a whole stream; each worker records the bodies it got.

Run:  python3 tests/router/test_resume.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import FAST, Cleanup, Router, parse_prom_samples, prom_value, request  # noqa: E402

TESTS, test = h.registry()


class Breaks:
    """How many streamed answers, over every worker sharing it, still break (the first ones)."""

    def __init__(self, n):
        self.n, self.lock = n, threading.Lock()

    def take(self):
        with self.lock:
            self.n -= 1
            return self.n >= 0


class StreamWorker:
    """A worker on 127.0.0.1:0 answering /metrics, /v1/models and streamed chat/completions; the
    answers that breaks.take() allows break after three tokens (whichever worker the policy picks
    first breaks, the continuation goes elsewhere)."""

    def __init__(self, breaks, tool_call=False, error_code=None, hang_continuations=False):
        """error_code: a breaking answer ends with vLLM's error event of that code and [DONE] on a
        clean stream instead of losing the connection. hang_continuations: a continuation (its
        last message the assistant's) is read and never answered, as a hung engine does."""
        self.breaks, self.tool_call, self.bodies = breaks, tool_call, []
        self.hang_continuations = hang_continuations
        self.error_code = error_code
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def kill(self):  # Cleanup protocol
        self.stop = True
        self.sock.close()

    def _accept(self):
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _chunk(self, obj_kind, text=None, finish=None, usage=None, role=False):
        cid = "cmpl-%s" % self.sock.getsockname()[1]
        if usage is not None:
            o = {"id": cid, "object": obj_kind, "created": 1, "model": "m", "choices": [],
                 "usage": usage}
        elif obj_kind == "text_completion":
            o = {"id": cid, "object": obj_kind, "created": 1, "model": "m",
                 "choices": [{"index": 0, "text": text or "", "finish_reason": finish}]}
        else:
            delta = {"role": "assistant", "content": ""} if role else {"content": text}
            if self.tool_call and not role:
                delta = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
            o = {"id": cid, "object": obj_kind, "created": 1, "model": "m",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return ("data: " + json.dumps(o) + "\n\n").encode()

    def _serve(self, c):
        buf = b""
        try:
            while True:
                d = c.recv(65536)
                if not d:
                    return
                buf += d
                while b"\r\n\r\n" in buf:
                    head, rest = buf.split(b"\r\n\r\n", 1)
                    cl = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            cl = int(line.split(b":")[1])
                    if len(rest) < cl:
                        break
                    body, buf = rest[:cl], rest[cl:]
                    if not self._answer(c, head.split(b" ")[1], body):
                        return
        except OSError:
            return
        finally:
            c.close()

    def _answer(self, c, path, body):
        def plain(b):
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
        if path == b"/metrics":
            plain(b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
            return True
        if path == b"/v1/models":
            plain(b'{"object":"list","data":[{"id":"m","max_model_len":4096}]}')
            return True
        req = json.loads(body)
        self.bodies.append(req)
        if self.hang_continuations and (req.get("messages") or [{}])[-1].get("role") == "assistant":
            while not self.stop:  # hung: the connection stays open, nothing is sent
                time.sleep(0.05)
            return False
        if not req.get("stream"):  # a whole answer; a breaking one stops halfway through its body
            port = self.sock.getsockname()[1]
            whole = json.dumps({"id": "chatcmpl-%d" % port, "object": "chat.completion",
                                "created": 1, "model": "m", "choices": [{
                                    "index": 0, "finish_reason": "stop", "message": {
                                        "role": "assistant", "content": "from %d" % port}}],
                                "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                                          "total_tokens": 7}}).encode()
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(whole))
            if self.breaks.take():
                c.sendall(whole[:len(whole) // 2])
                time.sleep(0.05)
                c.shutdown(socket.SHUT_RDWR)
                return False
            c.sendall(whole)
            return True
        kind = "chat.completion.chunk" if path == b"/v1/chat/completions" else "text_completion"
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")

        def send(x):
            c.sendall(b"%x\r\n" % len(x) + x + b"\r\n")
        if kind == "chat.completion.chunk":
            send(self._chunk(kind, role=True))
        if self.breaks.take():
            for w in ("one ", "two ", "three "):
                send(self._chunk(kind, w))
            if self.error_code is not None:  # vLLM's error inside a stream, then [DONE]
                err = {"error": {"message": "engine died", "code": self.error_code, "param": None,
                                 "type": "InternalServerError" if self.error_code >= 500
                                 else "BadRequestError"}}
                send(("data: " + json.dumps(err) + "\n\n").encode())
                send(b"data: [DONE]\n\n")
                send(b"")
                return True
            time.sleep(0.05)  # the tokens reach the router before the connection goes
            c.shutdown(socket.SHUT_RDWR)
            return False  # closed mid-chunked-body: the stream breaks mid-answer
        for w in ("four ", "five"):
            send(self._chunk(kind, w))
        send(self._chunk(kind, "", finish="stop"))
        send(self._chunk(kind, usage={"prompt_tokens": 20, "completion_tokens": 2,
                                      "total_tokens": 22}))
        send(b"data: [DONE]\n\n")
        send(b"")
        return True


def events_of(body):
    return [e[len("data: "):] for e in body.decode().split("\n") if e.startswith("data: ")]


def stream(r, path, body):
    return request(r.port, "POST", path, body, timeout=10)


def resumes(r, result):
    return prom_value(parse_prom_samples(r.metrics_text()), "kvrouter_stream_resumes_total",
                      result=result)


@test(timeout=30)
def test_chat_resumed_as_one_stream():
    """The client sees one stream: the first worker's role chunk and three tokens, then the second
    worker's two tokens under the same id, no second role chunk, usage 17 + 5 (the continuation's
    prompt held the 3 tokens the client already had), finish_reason stop and [DONE]; the second
    worker got the continuation vLLM's way."""
    with Cleanup() as c:
        b = Breaks(1)
        w1, w2 = c.add(StreamWorker(b)), c.add(StreamWorker(b))
        r = c.add(Router([w1.url, w2.url], *FAST, "--policy", "round_robin"))
        resp = stream(r, "/v1/chat/completions", {
            "model": "m", "stream": True, "max_tokens": 10,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "count"}]})
        assert resp.status == 200 and resp.complete, resp
        ev = events_of(resp.body)
        assert ev[-1] == "[DONE]", ev
        chunks = [json.loads(e) for e in ev[:-1]]
        first, good = (w1, w2) if w2.bodies and len(w2.bodies[-1]["messages"]) == 2 else (w2, w1)
        assert {ch["id"] for ch in chunks} == {"cmpl-%s" % first.url.rsplit(":", 1)[1]}, chunks
        roles = [ch for ch in chunks if ch["choices"] and "role" in ch["choices"][0]["delta"]]
        assert len(roles) == 1, roles
        text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks
                       if ch["choices"])
        assert text == "one two three four five", text
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
        assert chunks[-1]["usage"] == {"prompt_tokens": 17, "completion_tokens": 5,
                                       "total_tokens": 22}, chunks[-1]
        cont = good.bodies[-1]
        assert cont["messages"][-1] == {"role": "assistant", "content": "one two three "}, cont
        assert cont["continue_final_message"] is True and cont["add_generation_prompt"] is False
        assert cont["max_tokens"] == 7, cont
        assert resumes(r, "resumed") == 1


@test(timeout=30)
def test_continuation_goes_back_to_a_worker_tried_before_the_latest_break():
    """A stream breaks on worker A, its continuation breaks on B after more tokens: A, still
    usable, takes the second continuation (it avoids only B, the worker of the latest break) and
    the client gets the whole answer. The old router avoided every worker the request had tried
    and ended this stream with "no other worker could continue the answer"."""
    with Cleanup() as c:
        b = Breaks(2)
        w1, w2 = c.add(StreamWorker(b)), c.add(StreamWorker(b))
        r = c.add(Router([w1.url, w2.url], *FAST, "--policy", "round_robin"))
        resp = stream(r, "/v1/chat/completions", {
            "model": "m", "stream": True, "max_tokens": 10,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "count"}]})
        assert resp.status == 200 and resp.complete, resp
        ev = events_of(resp.body)
        chunks = [json.loads(e) for e in ev[:-1]]
        assert ev[-1] == "[DONE]" and not [ch for ch in chunks if "error" in ch], ev
        text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks
                       if ch["choices"])
        assert text == "one two three one two three four five", text
        assert chunks[-1]["usage"]["completion_tokens"] == 8, chunks[-1]
        a, bw = (w1, w2) if len(w1.bodies) == 2 else (w2, w1)
        assert len(a.bodies) == 2 and len(bw.bodies) == 1, (a.bodies, bw.bodies)
        assert len(a.bodies[0]["messages"]) == 1  # A got the request first ...
        assert bw.bodies[0]["messages"][-1]["content"] == "one two three "  # B the first part
        last = a.bodies[1]  # ... and the second continuation, with both parts
        assert last["messages"][-1] == {"role": "assistant",
                                        "content": "one two three one two three "}, last
        assert last["max_tokens"] == 4, last
        assert resumes(r, "resumed") == 2 and resumes(r, "no_worker") == 0


@test(timeout=30)
def test_continuation_takes_an_ejected_worker_when_nothing_else_is_left():
    """Outlier ejection after one failure: A's broken stream ejects A (B is up), the continuation
    breaks on B (not ejected: the last up worker). The next continuation avoids B; the only worker
    left is A, ejected for 30 s but not down: it takes the continuation as its trial, the answer
    completes there and A is up again. Without the last resort the stream ended with "no other
    worker could continue the answer"."""
    with Cleanup() as c:
        b = Breaks(2)
        w1, w2 = c.add(StreamWorker(b)), c.add(StreamWorker(b))
        r = c.add(Router([w1.url, w2.url], *FAST, "--policy", "round_robin",
                         "--outlier-consecutive-failures", "1"))
        resp = stream(r, "/v1/chat/completions", {
            "model": "m", "stream": True, "max_tokens": 10,
            "messages": [{"role": "user", "content": "count"}]})
        ev = events_of(resp.body)
        chunks = [json.loads(e) for e in ev[:-1]]
        assert ev[-1] == "[DONE]" and not [ch for ch in chunks if "error" in ch], ev
        text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks
                       if ch["choices"])
        assert text == "one two three one two three four five", text
        a = w1 if len(w1.bodies) == 2 else w2
        assert len(a.bodies) == 2 and len(w1.bodies) + len(w2.bodies) == 3
        m = parse_prom_samples(r.metrics_text())
        assert prom_value(m, "kvrouter_worker_ejections_total", url=a.url) == 1, m
        assert prom_value(m, "kvrouter_ejections_refused_total") == 1  # B, the last up one
        assert {w["url"]: w["state"] for w in r.workers()}[a.url] == "up"  # the trial restored A
        assert resumes(r, "resumed") == 2 and resumes(r, "no_worker") == 0


@test(timeout=30)
def test_continuation_to_a_hung_worker_moves_on():
    """A continuation sent to a worker that never answers (hung) is continued again elsewhere when
    its first-byte timeout fires, avoiding both the worker that broke the stream and the hung one
    (it sent no token). The old router ended the stream there, saying "no data within the idle
    timeout"."""
    with Cleanup() as c:
        b = Breaks(1)
        w1 = c.add(StreamWorker(b, hang_continuations=True))
        w2 = c.add(StreamWorker(b, hang_continuations=True))
        w3 = c.add(StreamWorker(b))
        r = c.add(Router([w1.url, w2.url, w3.url], *FAST, "--policy", "round_robin",
                         "--first-byte-timeout-ms", "500"))
        resp = stream(r, "/v1/chat/completions", {
            "model": "m", "stream": True, "max_tokens": 10,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "count"}]})
        ev = events_of(resp.body)
        chunks = [json.loads(e) for e in ev[:-1]]
        assert ev[-1] == "[DONE]" and not [ch for ch in chunks if "error" in ch], ev
        text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks
                       if ch["choices"])
        assert text == "one two three four five", text
        assert chunks[-1]["usage"]["completion_tokens"] == 5, chunks[-1]
        hung = [w for w in (w1, w2) if w.bodies and w.bodies[-1]["messages"][-1]["role"] ==
                "assistant"]
        assert len(hung) == 1 and len(w3.bodies) == 1, (w1.bodies, w2.bodies, w3.bodies)
        assert w3.bodies[0]["messages"][-1]["content"] == "one two three "
        assert resumes(r, "resumed") == 2


@test(timeout=30)
def test_continuations_bounded_per_request_not_by_the_retry_budget():
    """With the retry budget at nothing (0%, no minimum), a broken stream is still continued: a
    refused continuation would lose an answer whose client has part of it. --resume-max bounds
    them: past it the error event says so, counted as refused."""
    with Cleanup() as c:
        b = Breaks(1)
        w1, w2 = c.add(StreamWorker(b)), c.add(StreamWorker(b))
        r = c.add(Router([w1.url, w2.url], *FAST, "--policy", "round_robin",
                         "--retry-budget-percent", "0", "--retry-min-concurrency", "0"))
        body = {"model": "m", "stream": True, "max_tokens": 10,
                "messages": [{"role": "user", "content": "count"}]}
        ev = events_of(stream(r, "/v1/chat/completions", body).body)
        assert ev[-1] == "[DONE]" and "error" not in json.loads(ev[-2]), ev
        assert resumes(r, "resumed") == 1 and resumes(r, "refused") == 0
        b2 = Breaks(2)
        w3, w4 = c.add(StreamWorker(b2)), c.add(StreamWorker(b2))
        r2 = c.add(Router([w3.url, w4.url], *FAST, "--policy", "round_robin", "--resume-max", "1"))
        ev = events_of(stream(r2, "/v1/chat/completions", body).body)
        err = json.loads(ev[-2])["error"]
        assert "not continued: 1 continuations" in err["message"], err
        assert "--resume-max" in err["message"] and ev[-1] == "[DONE]", err
        assert resumes(r2, "resumed") == 1 and resumes(r2, "refused") == 1


@test(timeout=30)
def test_completions_resumed_with_the_text_so_far():
    """A completions stream continues with prompt + text so far."""
    with Cleanup() as c:
        b = Breaks(1)
        w1, w2 = c.add(StreamWorker(b)), c.add(StreamWorker(b))
        r = c.add(Router([w1.url, w2.url], *FAST, "--policy", "round_robin"))
        resp = stream(r, "/v1/completions", {"model": "m", "stream": True, "max_tokens": 8,
                                             "prompt": "Count: "})
        good = w1 if len(w1.bodies) and w1.bodies[-1]["prompt"] != "Count: " else w2
        assert resp.status == 200 and resp.complete, resp
        ev = events_of(resp.body)
        text = "".join(json.loads(e)["choices"][0]["text"] for e in ev[:-1]
                       if json.loads(e)["choices"])
        assert text == "one two three four five" and ev[-1] == "[DONE]", ev
        assert good.bodies[-1]["prompt"] == "Count: one two three ", good.bodies[-1]
        assert good.bodies[-1]["max_tokens"] == 5


@test(timeout=30)
def test_error_event_resumed():
    """A worker that sends vLLM's 5xx error event mid-stream (then [DONE], the connection clean)
    is a broken stream too: the event is held back and the answer continues elsewhere, one stream
    as above. A 4xx error event is the request's fault: passed through as sent, not resumed."""
    with Cleanup() as c:
        b = Breaks(1)
        w1, w2 = c.add(StreamWorker(b, error_code=500)), c.add(StreamWorker(b, error_code=500))
        r = c.add(Router([w1.url, w2.url], *FAST, "--policy", "round_robin"))
        resp = stream(r, "/v1/chat/completions", {
            "model": "m", "stream": True, "max_tokens": 10,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "count"}]})
        assert resp.status == 200 and resp.complete, resp
        ev = events_of(resp.body)
        assert ev[-1] == "[DONE]" and ev.count("[DONE]") == 1, ev
        chunks = [json.loads(e) for e in ev[:-1]]
        assert not [ch for ch in chunks if "error" in ch], chunks
        text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks
                       if ch["choices"])
        assert text == "one two three four five", text
        assert chunks[-1]["usage"]["completion_tokens"] == 5, chunks[-1]
        assert resumes(r, "resumed") == 1
        good = w1 if len(w1.bodies) and w1.bodies[-1]["messages"][-1]["role"] == "assistant" \
            else w2
        assert good.bodies[-1]["messages"][-1]["content"] == "one two three "
        b4 = Breaks(1)
        w3, w4 = c.add(StreamWorker(b4, error_code=400)), c.add(StreamWorker(b4, error_code=400))
        r2 = c.add(Router([w3.url, w4.url], *FAST, "--policy", "round_robin"))
        ev = events_of(stream(r2, "/v1/completions", {"model": "m", "stream": True,
                                                      "max_tokens": 8, "prompt": "Count: "}).body)
        err = json.loads(ev[-2])["error"]
        assert err["code"] == 400 and err["message"] == "engine died" and ev[-1] == "[DONE]", ev
        assert len(w3.bodies) + len(w4.bodies) == 1 and resumes(r2, "resumed") == 0


@test(timeout=30)
def test_held_answer_broken_mid_body_retried_whole():
    """A non-streamed answer whose body broke halfway never reached the client (the router holds
    it): the request is retried whole on another worker and the client gets that answer, once."""
    with Cleanup() as c:
        b = Breaks(1)
        w1, w2 = c.add(StreamWorker(b)), c.add(StreamWorker(b))
        r = c.add(Router([w1.url, w2.url], *FAST, "--policy", "round_robin"))
        resp = request(r.port, "POST", "/v1/chat/completions", {
            "model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
            timeout=10)
        assert resp.status == 200, resp
        ans = json.loads(resp.body)
        assert len(w1.bodies) == 1 and len(w2.bodies) == 1, (w1.bodies, w2.bodies)
        port = ans["id"].split("-")[1]  # the worker that answered whole; the other one broke
        assert port in (w1.url.rsplit(":", 1)[1], w2.url.rsplit(":", 1)[1]), ans
        assert ans["choices"][0]["message"]["content"] == "from " + port, ans
        samples = parse_prom_samples(r.metrics_text())
        assert prom_value(samples, "kvrouter_worker_retries_total") == 1


@test(timeout=30)
def test_not_resumed_ends_with_the_error_event():
    """A tool call in flight, the switch off, or no other worker: the stream ends with the error
    event (naming why it broke), counted by result."""
    with Cleanup() as c:
        b = Breaks(1)
        w1, w2 = c.add(StreamWorker(b, tool_call=True)), c.add(StreamWorker(b, tool_call=True))
        r = c.add(Router([w1.url, w2.url], *FAST, "--policy", "round_robin"))
        body = {"model": "m", "stream": True, "max_tokens": 10,
                "messages": [{"role": "user", "content": "call a tool"}]}
        ev = events_of(stream(r, "/v1/chat/completions", body).body)
        err = json.loads(ev[-2])["error"]
        assert err["code"] == "upstream_stream_broken" and ev[-1] == "[DONE]", err
        assert "not continued: a tool call's arguments were streaming" in err["message"], err
        assert resumes(r, "not_resumable") == 1 and len(w1.bodies) + len(w2.bodies) == 1
        b2 = Breaks(1)
        w3, w4 = c.add(StreamWorker(b2)), c.add(StreamWorker(b2))
        r2 = c.add(Router([w3.url, w4.url], *FAST, "--policy", "round_robin",
                          "--resume-streams", "false"))
        ev = events_of(stream(r2, "/v1/chat/completions", body).body)
        assert "error" in json.loads(ev[-2]) and resumes(r2, "not_resumable") == 1
        lonely = c.add(StreamWorker(Breaks(1)))
        r3 = c.add(Router([lonely.url], *FAST))
        ev = events_of(stream(r3, "/v1/chat/completions", body).body)
        err = json.loads(ev[-2])["error"]
        assert "no other worker could continue the answer" in err["message"], err
        assert resumes(r3, "no_worker") == 1


if __name__ == "__main__":
    h.run(TESTS)
