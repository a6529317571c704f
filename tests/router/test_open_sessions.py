#!/usr/bin/env python3
"""Open Responses sessions (issue 34): a stored response id counts as an open session on the
worker that made it until the next turn names it (src/core/router_affinity.c), shown per worker as
`open_sessions` in GET /admin/workers, and kv_aware weighs it (session_weight) when it places a
new request: the router pins that next turn there whatever the policy says. Two `kvrouter sim`
with vLLM's Responses store on (VLLM_ENABLE_RESPONSES_API_STORE=1) behind one router on loopback.

Run:  python3 tests/router/test_open_sessions.py --kvrouter build/kvrouter [-k substring] [-v]
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import FAST, MODEL, Cleanup, Router, Sim, request  # noqa: E402

TESTS, test = h.registry()
STORE_ENV = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}


def turn(r, text, prev=None, store=None):
    """One Responses turn through the router: (the worker it went to, the answer's id)."""
    body = {"model": MODEL, "input": text, "max_output_tokens": 2}
    if prev is not None:
        body["previous_response_id"] = prev
    if store is not None:
        body["store"] = store
    resp = request(r.port, "POST", "/v1/responses", body)
    assert resp.status == 200, (resp.status, resp.body[:300])
    return resp.header("x-kvrouter-worker"), json.loads(resp.body)["id"]


def open_sessions(r):
    return {str(w["id"]): w["open_sessions"] for w in r.workers()}


def start_text(tag):
    # Unrelated first turns (no shared prefix): nothing cached decides between the workers.
    return "%s: %s" % (tag, "plan the next step of the task " * 12)


@test(timeout=40)
def test_open_sessions_are_counted_and_weighed():
    """A first turn opens a session on its worker; the next session starts on the other worker
    (equal otherwise, the open one weighs 512 tokens there); a follow-up goes to its worker,
    closes its turn's session and opens the next; further starts keep the counts even."""
    with Cleanup() as c:
        sims = [c.add(Sim(fixed=(2, 1), env=STORE_ENV)), c.add(Sim(fixed=(2, 1), env=STORE_ENV))]
        r = c.add(Router(sims, *FAST, "--worker-header", "true", "--policy", "kv_aware"))
        assert set(open_sessions(r).values()) == {0}
        a_worker, a_id = turn(r, start_text("session a"))
        other = [k for k in open_sessions(r) if k != a_worker][0]
        assert open_sessions(r) == {a_worker: 1, other: 0}, open_sessions(r)
        b_worker, b_id = turn(r, start_text("session b"))
        assert b_worker == other, (a_worker, b_worker)
        assert open_sessions(r) == {a_worker: 1, other: 1}, open_sessions(r)
        # Session a's next turn: pinned to its worker; its old id closes, its answer opens anew.
        w, a2_id = turn(r, "the tool said: done", prev=a_id)
        assert w == a_worker and a2_id != a_id, (w, a_worker)
        assert open_sessions(r) == {a_worker: 1, other: 1}, open_sessions(r)
        w, _ = turn(r, "the tool said: done", prev=b_id)
        assert w == other
        # Eight more starts, each weighed against the sessions the others left open: the two
        # workers' counts never differ by more than one (idle otherwise, nothing cached).
        for i in range(8):
            turn(r, start_text("session %d" % i))
            counts = open_sessions(r)
            assert abs(counts[a_worker] - counts[other]) <= 1, (i, counts)
        assert sum(open_sessions(r).values()) == 10
        # route/explain shows each worker's count beside its cost (a look: nothing changes).
        resp = request(r.admin_port, "POST", "/admin/route/explain",
                       {"model": MODEL, "messages": [{"role": "user",
                                                      "content": start_text("explained")}]})
        assert resp.status == 200, resp.body[:300]
        shown = {str(w["id"]): w["open_sessions"] for w in json.loads(resp.body)["workers"]}
        assert shown == open_sessions(r), (shown, open_sessions(r))


@test(timeout=40)
def test_unstored_answers_open_no_session():
    """"store": false: vLLM keeps nothing, so no next turn can name the answer: its id is not
    remembered and opens no session (the counts stay 0); a stored answer then opens one."""
    with Cleanup() as c:
        sims = [c.add(Sim(fixed=(2, 1), env=STORE_ENV)), c.add(Sim(fixed=(2, 1), env=STORE_ENV))]
        r = c.add(Router(sims, *FAST, "--worker-header", "true", "--policy", "kv_aware"))
        for i in range(3):
            turn(r, start_text("unstored %d" % i), store=False)
        assert set(open_sessions(r).values()) == {0}, open_sessions(r)
        w, _ = turn(r, start_text("stored"), store=True)
        assert open_sessions(r)[w] == 1, open_sessions(r)

if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__.splitlines()[0]))
