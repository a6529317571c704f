#!/usr/bin/env python3
"""KV-cache events of `kvrouter sim --kv-events-config`, read as a consumer of vLLM reads them:
a ZMQ SUB receiving 3-frame messages (topic, 8-byte big-endian sequence, msgpack EventBatch) and a
DEALER asking the replay socket for old batches. Checked in both encodings (map, vLLM 0.26; array,
vLLM 0.23): the frames and sequence, every field of BlockStored / BlockRemoved / AllBlocksCleared,
the hash chain (parent links, token count = blocks x block_size), that a cached prefix is not
stored twice, POST /tokenize giving the ids BlockStored reports, evictions under a small cache (every removed hash was stored, the stored set never
exceeds the cache), AllBlocksCleared after POST /reset_prefix_cache, both replay reply forms and
their end markers, a restart counting from 0 again, vLLM's bind-or-connect rule, and the config
errors. Uses Debian's python3-zmq and python3-msgpack (exit 77 = skipped when they are missing).

    python3 tests/router/test_sim_kv_events.py --kvrouter build/kvrouter [-k NAME] [-v]
"""

import json
import os
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
import kvrharness as h  # noqa: E402
from kvrharness import MODEL, Sim  # noqa: E402

try:
    import msgpack
    import zmq
except ImportError:
    # Debian's python3-zmq and python3-msgpack live in the system's dist-packages, which a Python
    # of the same version from elsewhere (pyenv) does not search.
    sys.path.append("/usr/lib/python3/dist-packages")
    try:
        import msgpack
        import zmq
    except ImportError:
        print("SKIP: python3-zmq and python3-msgpack are needed (apt-get install python3-zmq "
              "python3-msgpack)")
        sys.exit(77)

TESTS, test = h.registry()
END_SEQ = 0xFFFFFFFFFFFFFFFF
BLOCK = 16


def events_config(endpoint, replay=None, **extra):
    cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint,
           "topic": "kv@test"}
    if replay:
        cfg["replay_endpoint"] = replay
    cfg.update(extra)
    return json.dumps(cfg)


class Sub:
    """A SUB socket on the loopback that binds (the sim connects to 127.0.0.1, vLLM's rule) or
    connects (to an ipc:// endpoint the sim binds)."""

    def __init__(self, ctx, bind=None, connect=None):
        self.s = ctx.socket(zmq.SUB)
        self.s.setsockopt(zmq.SUBSCRIBE, b"")
        self.s.setsockopt(zmq.LINGER, 0)
        if bind:
            self.s.bind(bind)
        else:
            self.s.connect(connect)

    def recv(self, timeout=5.0):
        """One message as (topic, seq, decoded batch, raw payload), or None after timeout."""
        if not self.s.poll(int(timeout * 1000)):
            return None
        frames = self.s.recv_multipart()
        assert len(frames) == 3, "a live message has 3 frames, got %d" % len(frames)
        topic, seqb, payload = frames
        assert len(seqb) == 8, "sequence frame of %d bytes" % len(seqb)
        return topic, struct.unpack(">Q", seqb)[0], msgpack.unpackb(payload, raw=False), payload

    def drain(self, quiet=0.5, limit=10000):
        out = []
        while len(out) < limit:
            m = self.recv(timeout=quiet)
            if m is None:
                return out
            out.append(m)
        return out

    def close(self):
        self.s.close()


def decode_event(ev):
    """An event in either encoding as a dict with vLLM's field names."""
    if isinstance(ev, dict):
        return ev
    assert isinstance(ev, list) and ev and isinstance(ev[0], str), ev
    names = {"BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size",
                             "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
                             "kv_cache_spec_kind", "kv_cache_spec_sliding_window"],
             "BlockRemoved": ["block_hashes", "medium", "group_idx"],
             "AllBlocksCleared": []}[ev[0]]
    assert len(ev) - 1 <= len(names), ev
    d = {"type": ev[0]}
    d.update(zip(names, ev[1:]))
    return d


def batch_events(batch):
    assert isinstance(batch, list) and len(batch) in (2, 3), batch
    ts, events = batch[0], batch[1]
    assert isinstance(ts, float) and abs(ts - time.time()) < 60, ts
    if len(batch) == 3:
        assert batch[2] == 0, "data_parallel_rank %r" % batch[2]
    return [decode_event(e) for e in events]


def chat(sim, content, max_tokens=20):
    st, body = sim.post_json("/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "ignore_eos": True})
    assert st == 200, (st, body)
    return body["usage"]


def words(n, seed):
    return " ".join("w%d_%d" % (seed, i) for i in range(n))


def check_stored(e, encoding):
    assert e["block_size"] == BLOCK
    n = len(e["block_hashes"])
    assert n >= 1 and len(e["token_ids"]) == n * BLOCK, (n, len(e["token_ids"]))
    assert all(isinstance(x, int) and 0 <= x < 2 ** 64 for x in e["block_hashes"])
    assert all(isinstance(t, int) and 0 <= t < 128256 for t in e["token_ids"])
    assert e["medium"] == "GPU" and e["lora_id"] is None and e["lora_name"] is None
    if encoding == "map":
        assert e["group_idx"] == 0 and e["kv_cache_spec_kind"] == "full_attention"
        assert e["extra_keys"] == [None] * n
    else:
        assert "group_idx" not in e, "the array encoding stops at lora_name (vLLM 0.23)"


class Model:
    """What a consumer builds from the events: the engine hashes a worker holds, and the chain."""

    def __init__(self, encoding):
        self.encoding = encoding
        self.held = set()
        self.stored = self.removed = self.cleared = 0

    def apply(self, events):
        for e in events:
            if e["type"] == "BlockStored":
                check_stored(e, self.encoding)
                p = e["parent_block_hash"]
                assert p is None or p in self.held, "parent %x of a stored run not held" % p
                for x in e["block_hashes"]:
                    assert x not in self.held, "block %x stored twice" % x
                    self.held.add(x)
                self.stored += len(e["block_hashes"])
            elif e["type"] == "BlockRemoved":
                assert e["medium"] == "GPU"
                for x in e["block_hashes"]:
                    assert x in self.held, "removed block %x was never stored" % x
                    self.held.discard(x)
                self.removed += len(e["block_hashes"])
            else:
                assert e["type"] == "AllBlocksCleared", e
                self.held.clear()
                self.cleared += 1


def start_pair(ctx, encoding, *flags, replay=True):
    """A SUB bound on a free loopback port, and a sim connecting its PUB to it."""
    port = h.closed_port()
    sub = Sub(ctx, bind="tcp://127.0.0.1:%d" % port)
    rport = h.closed_port() if replay else None
    cfg = events_config("tcp://127.0.0.1:%d" % port,
                        replay="tcp://127.0.0.1:%d" % rport if replay else None)
    sim = Sim("--time-scale", 20, "--kv-events-config", cfg, "--kv-events-encoding", encoding,
              *flags, fixed=None)
    settle(sub)
    return sub, sim, rport


def settle(sub):
    """Lets the connection and the subscription complete. ZMQ runs a socket's commands (the
    pipe attach that sends SUBSCRIBE) only inside calls on that socket, so the consumer polls
    instead of sleeping; nothing may arrive yet."""
    assert sub.drain(quiet=0.3) == [], "events before any request"


def live_sequence(msgs, first=0):
    seqs = [m[1] for m in msgs]
    assert seqs == list(range(first, first + len(seqs))), seqs[:20]
    for topic, _, _, _ in msgs:
        assert topic == b"kv@test", topic


@test(timeout=60)
def test_stored_chain_and_prefix_reuse_both_encodings():
    for encoding in ("map", "array"):
        ctx = zmq.Context()
        sub, sim, _ = start_pair(ctx, encoding)
        try:
            usage = chat(sim, words(120, 1))
            msgs = sub.drain()
            assert msgs, "no event batch after a completion (%s)" % encoding
            live_sequence(msgs)
            model = Model(encoding)
            events = [e for m in msgs for e in batch_events(m[2])]
            model.apply(events)
            stored = [e for e in events if e["type"] == "BlockStored"]
            assert stored[0]["parent_block_hash"] is None, "the chain's first run has no parent"
            chain = [x for e in stored for x in e["block_hashes"]]
            for prev, e in zip(stored, stored[1:]):
                assert e["parent_block_hash"] == prev["block_hashes"][-1], "broken parent link"
            total = usage["prompt_tokens"] + usage["completion_tokens"]
            # every full block of the prompt and of all but the last generated token is cached
            assert len(chain) == (total - 1) // BLOCK, (len(chain), total)
            # the same prompt again: its prefix is cached, nothing of it is stored twice
            chat(sim, words(120, 1))
            again = [e for m in sub.drain() for e in batch_events(m[2])]
            model.apply(again)
            assert not any(x in chain for e in again if e["type"] == "BlockStored"
                           for x in e["block_hashes"])
        finally:
            sim.stop()
            sub.close()
            ctx.term()


@test(timeout=90)
def test_evictions_and_clear():
    ctx = zmq.Context()
    sub, sim, _ = start_pair(ctx, "map", "--num-gpu-blocks", 64)
    try:
        model = Model("map")
        for i in range(6):
            chat(sim, words(200, 10 + i), max_tokens=10)
            model.apply([e for m in sub.drain(quiet=0.3) for e in batch_events(m[2])])
            assert len(model.held) <= 64, len(model.held)
        assert model.removed > 0, "six 50-block prompts through 64 blocks evict nothing?"
        assert model.held, "nothing held after the last request"
        r = sim.request("POST", "/reset_prefix_cache")
        assert r.status == 200, r.status
        # vLLM publishes from scheduler steps: the clear goes out with the next step's batch
        assert sub.drain(quiet=0.3) == [], "an idle engine published"
        chat(sim, words(40, 99), max_tokens=4)
        events = [e for m in sub.drain() for e in batch_events(m[2])]
        assert events[0]["type"] == "AllBlocksCleared", events[:2]
        model.apply(events)
        assert model.cleared == 1
        assert len(model.held) == sum(len(e["block_hashes"]) for e in events
                                      if e["type"] == "BlockStored")
    finally:
        sim.stop()
        sub.close()
        ctx.term()


def replay(ctx, port, start, timeout=5.0):
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect("tcp://127.0.0.1:%d" % port)
    try:
        d.send_multipart([b"", struct.pack(">Q", start)])
        out = []
        while True:
            assert d.poll(int(timeout * 1000)), "replay answer missing"
            out.append(d.recv_multipart())
            if END_SEQ.to_bytes(8, "big") in out[-1]:
                return out
    finally:
        d.close()


@test(timeout=60)
def test_replay_both_reply_forms():
    for encoding in ("map", "array"):
        ctx = zmq.Context()
        sub, sim, rport = start_pair(ctx, encoding)
        try:
            for i in range(3):
                chat(sim, words(60, 20 + i), max_tokens=6)
            live = sub.drain()
            assert len(live) >= 3, len(live)
            got = replay(ctx, rport, 1)
            end = got.pop()
            if encoding == "map":  # vLLM 0.26: ["", topic, seq, payload], end ["", "", END, ""]
                assert end == [b"", b"", END_SEQ.to_bytes(8, "big"), b""], end
                assert all(len(f) == 4 and f[0] == b"" and f[1] == b"kv@test" for f in got)
                pairs = [(struct.unpack(">Q", f[2])[0], f[3]) for f in got]
            else:  # older: ["", seq, payload], end ["", END, ""]
                assert end == [b"", END_SEQ.to_bytes(8, "big"), b""], end
                assert all(len(f) == 3 and f[0] == b"" for f in got)
                pairs = [(struct.unpack(">Q", f[1])[0], f[2]) for f in got]
            assert pairs == [(m[1], m[3]) for m in live[1:]], "replay differs from live"
            # past the newest batch: only the end marker
            assert len(replay(ctx, rport, len(live) + 5)) == 1
        finally:
            sim.stop()
            sub.close()
            ctx.term()


@test(timeout=60)
def test_replay_keeps_buffer_steps():
    ctx = zmq.Context()
    port, rport = h.closed_port(), h.closed_port()
    sub = Sub(ctx, bind="tcp://127.0.0.1:%d" % port)
    cfg = events_config("tcp://127.0.0.1:%d" % port, replay="tcp://127.0.0.1:%d" % rport,
                        buffer_steps=2)
    sim = Sim("--time-scale", 20, "--kv-events-config", cfg, fixed=None)
    settle(sub)
    try:
        for i in range(3):
            chat(sim, words(60, 40 + i), max_tokens=6)
        live = sub.drain()
        got = replay(ctx, rport, 0)[:-1]
        seqs = [struct.unpack(">Q", f[2])[0] for f in got]
        assert seqs == [live[-2][1], live[-1][1]], (seqs, len(live))
    finally:
        sim.stop()
        sub.close()
        ctx.term()


@test(timeout=60)
def test_restart_counts_from_zero_and_bind_rule():
    ctx = zmq.Context()
    path = os.path.join(tempfile.mkdtemp(prefix="kvr-ev-"), "events.sock")
    ep = "ipc://" + path  # ipc:// binds (vLLM's rule): the consumer connects
    try:
        for run in range(2):
            sim = Sim("--time-scale", 20, "--kv-events-config", events_config(ep), fixed=None)
            sub = Sub(ctx, connect=ep)
            settle(sub)
            try:
                chat(sim, words(60, 50), max_tokens=6)
                msgs = sub.drain()
                assert msgs and msgs[0][1] == 0, "run %d starts at %r" % (run, msgs[:1])
                live_sequence(msgs)
            finally:
                sim.stop()
                sub.close()
    finally:
        ctx.term()


@test(timeout=60)
def test_tokenize_ids_hash_like_the_events():
    """A consumer that tokenizes a request with POST /tokenize gets the token ids of the blocks
    the engine then reports in BlockStored: the prompt's full blocks, in order."""
    ctx = zmq.Context()
    sub, sim, _ = start_pair(ctx, "map")
    try:
        msgs = [{"role": "user", "content": words(90, 7)}]
        st, tok = sim.post_json("/tokenize", {"model": MODEL, "messages": msgs})
        assert st == 200, (st, tok)
        chat(sim, words(90, 7), max_tokens=3)
        stored = [e for m in sub.drain() for e in batch_events(m[2]) if e["type"] == "BlockStored"]
        ids = [t for e in stored for t in e["token_ids"]]
        full = tok["count"] // BLOCK * BLOCK
        assert full > 0 and ids[:full] == tok["tokens"][:full], "tokenize and events disagree"
    finally:
        sim.stop()
        sub.close()
        ctx.term()


@test(timeout=30)
def test_config_errors():
    cases = [
        ('{"enable_kv_cache_events": true, "bogus": 1}', 'unknown key "bogus"'),
        ('{"enable_kv_cache_events": true, "publisher": "kafka"}', 'publisher "kafka" unknown'),
        ('{"enable_kv_cache_events": "yes"}', "must be true or false"),
        ('{"buffer_steps": 0}', "buffer_steps"),
        ('[1]', "not a JSON object"),
        ('{"enable_kv_cache_events": true, "endpoint": "nonsense"}', "kv events"),
    ]
    for text, want in cases:
        p = subprocess.run([h._kvrouter(), "sim", "--listen", "127.0.0.1:0", "--kv-events-config",
                            text], capture_output=True, text=True, timeout=10)
        assert p.returncode != 0, text
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and want in lines[0], (text, p.stderr)


if __name__ == "__main__":
    sys.exit(h.run(TESTS, description=__doc__))
