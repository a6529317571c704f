#!/usr/bin/env node
// test_sdk_clients -- kvrouter tested with real clients (issue 36): the official OpenAI SDK for
// Node (npm `openai`) and the official Anthropic SDK (npm `@anthropic-ai/sdk`), at the versions
// pinned in tests/sdk/package-lock.json, against `kvrouter serve` in front of 4 `kvrouter sim`
// workers on 127.0.0.1 (started here, ports picked by the kernel, the sims with
// VLLM_ENABLE_RESPONSES_API_STORE=1 so that they store Responses).
//
// README: run `deploy/install-deps.sh` (it runs `npm ci` in tests/sdk), then
//   node tests/sdk/test_sdk_clients.mjs --kvrouter build/kvrouter     (CTest: script.test_sdk_clients)
// One PASS/FAIL line per case, the 10-turn previous_response_id chain as a table (turn, worker,
// response id), then "N passed, N failed". Exit 1 when a case failed, 77 (skipped) when the npm
// packages are not installed in tests/sdk/node_modules (CTest also skips when node is missing).
//
// What it proves: every response shape the router passes on (chat completions, completions,
// Responses, Anthropic Messages, each created and streamed, the SDKs' stream helpers
// (finalChatCompletion, finalResponse, finalMessage), responses.retrieve, messages.countTokens,
// errors) is parsed by the SDKs without complaint and carries the right text and usage figures;
// a repeated prompt goes to the worker holding its prefix and reads it from the cache; a
// 10-turn previous_response_id chain (turns alternately created and streamed) follows each
// response to the worker that stored it, each turn's prompt holding the whole conversation (its
// answer and prompt length are the chat answer to the transcript, asked of that worker directly)
// and reading more cached blocks than the turn before; every chain turn is retrieved from its
// worker; Responses ids are unique across the workers; one missing required field per API comes
// back as the SDK's BadRequestError with that API's error shape (and an unknown response id, an
// unknown model as NotFoundError). The worker of each answer is read from x-kvrouter-worker
// (kvrouter serve --worker-header true) on the raw response the SDKs expose (.withResponse(),
// MessageStream.withResponse(); the OpenAI stream helpers expose none, so the client's fetch keeps
// the last one). The sims answer deterministically: an answer's words are a function of the
// prompt and the worker's --seed. Each sim has its own seed, as each vLLM draws its own random
// ids, so text is compared on one worker. Options: --kvrouter PATH (default $KVROUTER, then
// build/kvrouter), --verbose (the processes' stderr).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = join(HERE, "..", "..");

let OpenAI, Anthropic, OPENAI_VERSION, ANTHROPIC_VERSION;
try {
  OpenAI = (await import("openai")).default;
  Anthropic = (await import("@anthropic-ai/sdk")).default;
  OPENAI_VERSION = (await import("openai/version")).VERSION;
  ANTHROPIC_VERSION = (await import("@anthropic-ai/sdk/version")).VERSION;
} catch (err) {
  console.log(`SKIP test_sdk_clients: npm packages not installed in tests/sdk (${err.code || err.message}); ` +
              "run deploy/install-deps.sh (npm ci --prefix tests/sdk)");
  process.exit(77);
}

// ---- options --------------------------------------------------------------------------------

const argv = process.argv.slice(2);
let KVROUTER = process.env.KVROUTER || join(ROOT, "build", "kvrouter");
let VERBOSE = false;
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === "--kvrouter" && i + 1 < argv.length) KVROUTER = argv[++i];
  else if (argv[i] === "--verbose") VERBOSE = true;
  else {
    console.error(`test_sdk_clients: unknown argument '${argv[i]}' (valid: --kvrouter PATH, --verbose)`);
    process.exit(2);
  }
}
if (!existsSync(KVROUTER)) {
  console.error(`test_sdk_clients: no kvrouter binary at ${KVROUTER} (--kvrouter PATH)`);
  process.exit(1);
}

const MODEL = "meta-llama/Llama-3.3-70B-Instruct"; // kvrouter sim's default --model
// Long enough (several of the router's 64-character prefix blocks, several 16-token KV blocks)
// that a repeated request has a cached prefix for the router to follow.
const SYSTEM = "You are a terse assistant for a geography quiz. Answer in one short line, " +
               "name places by their English names, and never ask a question back.";
const NWORKERS = 4;
const CHAIN_TURNS = 10;
const TIME_SCALE = 4;
const DEADLINE_MS = 50_000; // the whole run; CTest's TIMEOUT (300 s) is the outer bound

// ---- processes ------------------------------------------------------------------------------

const procs = [];

// Starts argv, collects its output and resolves with the first match of re (stdout or stderr).
function start(name, args, env, re) {
  const child = spawn(KVROUTER, args, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  const p = { name, child, out: "", exited: null };
  procs.push(p);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name}: no line matching ${re} within 10 s:\n${p.out}`)), 10_000);
    const onData = (d) => {
      const s = d.toString();
      p.out += s;
      if (VERBOSE) process.stderr.write(s.replace(/^/gm, `    [${name}] `));
      const m = p.out.match(re);
      if (m) { clearTimeout(timer); resolve({ ...p, m }); }
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    child.on("exit", (code, sig) => {
      p.exited = { code, sig };
      clearTimeout(timer);
      reject(new Error(`${name} exited (${code ?? sig}) before it listened:\n${p.out}`));
    });
    child.on("error", (e) => { clearTimeout(timer); reject(e); });
  });
}

// SIGTERM each process we started (by its PID), SIGKILL after 3 s. Returns what went wrong: one
// that had already exited, or one that did not exit 0 after SIGTERM.
async function stopAll() {
  const problems = [];
  await Promise.all(procs.map((p) => new Promise((resolve) => {
    if (p.exited) {
      problems.push(`${p.name} had exited (${p.exited.code ?? p.exited.sig})`);
      return resolve();
    }
    const kill = setTimeout(() => { p.child.kill("SIGKILL"); }, 3000);
    p.child.once("exit", (code, sig) => {
      clearTimeout(kill);
      if (code !== 0) problems.push(`${p.name} exit ${code ?? sig} after SIGTERM:\n${p.out.slice(-2000)}`);
      resolve();
    });
    p.child.kill("SIGTERM");
  })));
  return problems;
}

for (const sig of ["SIGINT", "SIGTERM"]) {
  process.on(sig, () => {
    for (const p of procs) if (!p.exited) p.child.kill("SIGKILL");
    process.exit(1);
  });
}

// ---- cases ----------------------------------------------------------------------------------

let passed = 0, failed = 0;
async function check(name, fn) {
  try {
    const detail = await fn();
    passed++;
    console.log(`PASS ${name}${detail ? ` -- ${detail}` : ""}`);
  } catch (err) {
    failed++;
    console.log(`FAIL ${name}: ${err && err.stack ? err.stack : err}`);
  }
}

function workerOf(response) {
  const w = response.headers.get("x-kvrouter-worker");
  assert.match(w ?? "", /^[0-3]$/, "x-kvrouter-worker names one of the 4 workers");
  return Number(w);
}

// An SDK usage object of an OpenAI chat/completions answer: exact figures, cached ones reported.
function checkOpenAIUsage(u, maxTokens) {
  assert.equal(u.completion_tokens, maxTokens, "ran to max_tokens");
  assert.ok(Number.isInteger(u.prompt_tokens) && u.prompt_tokens > 0, "prompt_tokens");
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens, "total_tokens");
  assert.ok(Number.isInteger(u.prompt_tokens_details?.cached_tokens), "prompt_tokens_details.cached_tokens");
  assert.ok(u.prompt_tokens_details.cached_tokens <= u.prompt_tokens);
}

function checkResponsesUsage(u, maxTokens) {
  assert.equal(u.output_tokens, maxTokens, "ran to max_output_tokens");
  assert.ok(Number.isInteger(u.input_tokens) && u.input_tokens > 0, "input_tokens");
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens, "total_tokens");
  assert.ok(Number.isInteger(u.input_tokens_details?.cached_tokens), "input_tokens_details.cached_tokens");
  assert.ok(u.input_tokens_details.cached_tokens <= u.input_tokens);
  assert.equal(u.output_tokens_details?.reasoning_tokens, 0);
}

function checkResponseObject(r, maxTokens) {
  assert.equal(r.object, "response");
  assert.match(r.id, /^resp_/);
  assert.equal(r.model, MODEL);
  assert.equal(r.status, "incomplete", "stopped by max_output_tokens");
  assert.deepEqual(r.incomplete_details, { reason: "max_output_tokens" });
  assert.equal(r.output.length, 1);
  assert.equal(r.output[0].type, "message");
  assert.equal(r.output[0].role, "assistant");
  assert.equal(r.output[0].content[0].type, "output_text");
  assert.ok(r.output_text.length > 0, "the SDK's output_text");
  assert.equal(r.output_text, r.output[0].content[0].text);
  checkResponsesUsage(r.usage, maxTokens);
}

function checkAnthropicUsage(u, maxTokens) {
  assert.equal(u.output_tokens, maxTokens, "ran to max_tokens");
  assert.ok(Number.isInteger(u.input_tokens) && u.input_tokens > 0, "input_tokens");
  assert.ok(Number.isInteger(u.cache_read_input_tokens), "cache_read_input_tokens");
}

function checkAnthropicMessage(m, maxTokens) {
  assert.equal(m.type, "message");
  assert.equal(m.role, "assistant");
  assert.equal(m.model, MODEL);
  assert.equal(m.stop_reason, "max_tokens");
  assert.equal(m.content.length, 1);
  assert.equal(m.content[0].type, "text");
  assert.ok(m.content[0].text.length > 0);
  checkAnthropicUsage(m.usage, maxTokens);
}

async function main() {
  const t0 = Date.now();
  // Each sim its own --seed, as each vLLM draws its own random ids: sims sharing a seed mint the
  // same Responses ids (resp_ + 16 hex from the seed and a counter), and two workers storing
  // different responses under one id send a follow-up to whichever the router learned last.
  // Answers then differ between workers, so text comparisons are made on one worker.
  const sims = await Promise.all(Array.from({ length: NWORKERS }, (_, i) => start(
    `sim${i}`,
    ["sim", "--listen", "127.0.0.1:0", "--enable-prompt-tokens-details", "--seed", String(i + 1),
     "--time-scale", String(TIME_SCALE), "--log-level", "warn"],
    { VLLM_ENABLE_RESPONSES_API_STORE: "1" },
    /sim listening on ([0-9.]+):(\d+)/)));
  const urls = sims.map((s) => `http://127.0.0.1:${s.m[2]}`);
  const router = await start(
    "serve",
    ["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--worker-header", "true",
     ...urls.flatMap((u) => ["--worker", u])],
    {},
    /listening on \S+ \(port (\d+)\), admin on \S+ \(port (\d+)\)/);
  const port = Number(router.m[1]);
  console.log(`openai ${OPENAI_VERSION}, @anthropic-ai/sdk ${ANTHROPIC_VERSION}, node ${process.version}; ` +
              `kvrouter serve on port ${port}, workers ${urls.join(" ")}`);

  // The OpenAI SDK's stream helpers (ChatCompletionStream, ResponseStream) expose no raw response:
  // the client's fetch keeps the last one's headers (lastRaw) for them.
  let lastRaw = null;
  const oai = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "sk-kvrouter-test",
                           maxRetries: 0, timeout: 20_000,
                           fetch: async (url, init) => (lastRaw = await fetch(url, init)) });
  // One client per worker, for the chain's cross-check on the worker itself.
  const direct = urls.map((u) => new OpenAI({ baseURL: `${u}/v1`, apiKey: "sk-kvrouter-test",
                                              maxRetries: 0, timeout: 20_000 }));
  const ant = new Anthropic({ baseURL: `http://127.0.0.1:${port}`, apiKey: "sk-ant-kvrouter-test",
                              maxRetries: 0, timeout: 20_000 });

  // ---- chat completions ----
  const chatMessages = [{ role: "system", content: SYSTEM },
                        { role: "user", content: "Name three rivers of Europe, with their lengths, " +
                                                 "their sources and the seas they flow into." }];
  let chatText, chatWorker;
  await check("chat.completions.create", async () => {
    const { data: c, response } = await oai.chat.completions.create(
      { model: MODEL, messages: chatMessages, max_tokens: 12 }).withResponse();
    assert.equal(c.object, "chat.completion");
    assert.match(c.id, /^chatcmpl-/);
    assert.equal(c.model, MODEL);
    assert.equal(c.choices.length, 1);
    assert.equal(c.choices[0].message.role, "assistant");
    assert.equal(c.choices[0].finish_reason, "length");
    chatText = c.choices[0].message.content;
    assert.ok(chatText.length > 0);
    checkOpenAIUsage(c.usage, 12);
    assert.ok(c._request_id, "x-request-id reaches the SDK");
    chatWorker = workerOf(response);
    return `worker ${chatWorker}, ${c.usage.prompt_tokens}+${c.usage.completion_tokens} tokens`;
  });
  await check("chat.completions.create stream", async () => {
    const { data: stream, response } = await oai.chat.completions.create(
      { model: MODEL, messages: chatMessages, max_tokens: 12, stream: true,
        stream_options: { include_usage: true } }).withResponse();
    let text = "", usage = null, finish = null, chunks = 0;
    for await (const ch of stream) {
      chunks++;
      assert.equal(ch.object, "chat.completion.chunk");
      if (ch.usage) usage = ch.usage;
      for (const choice of ch.choices) {
        text += choice.delta?.content ?? "";
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    assert.equal(finish, "length");
    assert.equal(workerOf(response), chatWorker, "the repeat goes to the worker holding its prefix");
    assert.equal(text, chatText, "the streamed answer is the non-streamed one");
    assert.ok(usage, "the include_usage chunk");
    checkOpenAIUsage(usage, 12);
    assert.ok(usage.prompt_tokens_details.cached_tokens > 0, "the same prompt again hits the cache");
    return `worker ${chatWorker}, ${chunks} chunks, cached ${usage.prompt_tokens_details.cached_tokens}`;
  });
  await check("chat.completions.stream (helper, finalChatCompletion)", async () => {
    const runner = oai.chat.completions.stream(
      { model: MODEL, messages: chatMessages, max_tokens: 12, stream_options: { include_usage: true } });
    let deltas = "";
    runner.on("content", (d) => { deltas += d; });
    const c = await runner.finalChatCompletion();
    assert.equal(workerOf(lastRaw), chatWorker, "the repeat goes to the worker holding its prefix");
    assert.equal(c.choices[0].message.content, chatText);
    assert.equal(deltas, chatText);
    assert.equal(c.choices[0].finish_reason, "length");
    checkOpenAIUsage(c.usage, 12);
  });

  // ---- completions ----
  const prompt = "A geography quiz, question 7. The rivers of Europe, longest first: the Volga " +
                 "(3,530 km), the Danube (2,850 km), the Ural (2,428 km), the Dnieper (2,201 km). " +
                 "The next one on the list is";
  let complText, complWorker;
  await check("completions.create", async () => {
    const { data: c, response } = await oai.completions.create(
      { model: MODEL, prompt, max_tokens: 10 }).withResponse();
    assert.equal(c.object, "text_completion");
    assert.match(c.id, /^cmpl-/);
    assert.equal(c.choices.length, 1);
    assert.equal(c.choices[0].finish_reason, "length");
    complText = c.choices[0].text;
    assert.ok(complText.length > 0);
    checkOpenAIUsage(c.usage, 10);
    complWorker = workerOf(response);
    return `worker ${complWorker}, ${c.usage.prompt_tokens}+${c.usage.completion_tokens} tokens`;
  });
  await check("completions.create stream", async () => {
    const { data: stream, response } = await oai.completions.create(
      { model: MODEL, prompt, max_tokens: 10, stream: true,
        stream_options: { include_usage: true } }).withResponse();
    let text = "", usage = null, finish = null;
    for await (const ch of stream) {
      assert.equal(ch.object, "text_completion");
      if (ch.usage) usage = ch.usage;
      for (const choice of ch.choices) {
        text += choice.text;
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    }
    assert.equal(finish, "length");
    assert.equal(workerOf(response), complWorker, "the repeat goes to the worker holding its prefix");
    assert.equal(text, complText, "the streamed answer is the non-streamed one");
    assert.ok(usage, "the include_usage chunk");
    checkOpenAIUsage(usage, 10);
    assert.ok(usage.prompt_tokens_details.cached_tokens > 0, "the same prompt again hits the cache");
    return `worker ${complWorker}, cached ${usage.prompt_tokens_details.cached_tokens}`;
  });

  // ---- Responses ----
  // The repeats store nothing ("store": false): a stored answer opens a session whose next turn
  // the router will pin to its worker, which kv_aware weighs against sending that worker more new
  // sessions (policies/README.md "Open sessions"); an unstored one opens none, so the repeat
  // follows its prefix alone. responses.retrieve below stores one.
  const rbody = { model: MODEL, instructions: SYSTEM,
                  input: "Describe the Danube in one line: where it rises, which capitals it passes.",
                  max_output_tokens: 8, store: false };
  let respObj, respWorker;
  const respIds = []; // every Responses id handed out in this run
  await check("responses.create", async () => {
    const { data: r, response } = await oai.responses.create(rbody).withResponse();
    checkResponseObject(r, 8);
    assert.equal(r.previous_response_id, null);
    respObj = r;
    respIds.push(r.id);
    respWorker = workerOf(response);
    return `worker ${respWorker}, ${r.id}`;
  });
  await check("responses.create stream", async () => {
    const { data: stream, response } = await oai.responses.create({ ...rbody, stream: true }).withResponse();
    const types = [];
    let text = "", done = null, seq = 0;
    for await (const ev of stream) {
      types.push(ev.type);
      assert.equal(ev.sequence_number, seq++, "sequence numbers from 0");
      if (ev.type === "response.output_text.delta") text += ev.delta;
      if (ev.type === "response.completed" || ev.type === "response.incomplete") done = ev.response;
    }
    assert.equal(types[0], "response.created");
    assert.ok(done, `a final response event (${types.join(",")})`);
    assert.equal(workerOf(response), respWorker, "the repeat goes to the worker holding its prefix");
    assert.equal(text, respObj.output_text, "the streamed answer is the non-streamed one");
    assert.equal(done.output[0].content[0].text, text);
    respIds.push(done.id);
    assert.equal(done.usage.output_tokens, 8);
    assert.equal(done.usage.total_tokens, done.usage.input_tokens + 8);
    assert.ok(done.usage.input_tokens_details.cached_tokens > 0, "the same prompt again hits the cache");
    return `worker ${respWorker}, ${types.length} events, last ${types.at(-1)}, ` +
           `cached ${done.usage.input_tokens_details.cached_tokens}`;
  });
  await check("responses.stream (helper, finalResponse)", async () => {
    const s = oai.responses.stream(rbody);
    let deltas = "";
    s.on("response.output_text.delta", (ev) => { deltas += ev.delta; });
    const r = await s.finalResponse();
    assert.equal(workerOf(lastRaw), respWorker, "the repeat goes to the worker holding its prefix");
    checkResponseObject(r, 8);
    respIds.push(r.id);
    assert.equal(r.output_text, respObj.output_text);
    assert.equal(deltas, respObj.output_text);
  });
  await check("responses.retrieve", async () => {
    // Stored this time: no session is open yet, so it too goes to the prefix's worker.
    const { data: st, response: sr } = await oai.responses.create({ ...rbody, store: true }).withResponse();
    assert.equal(workerOf(sr), respWorker, "the stored repeat goes to the worker holding its prefix");
    assert.equal(st.output_text, respObj.output_text);
    respIds.push(st.id);
    const { data: g, response } = await oai.responses.retrieve(st.id).withResponse();
    assert.equal(g.id, st.id);
    assert.equal(g.output_text, st.output_text);
    assert.deepEqual(g.usage, st.usage);
    assert.equal(workerOf(response), respWorker, "GET goes to the worker that stored it");
    await assert.rejects(oai.responses.retrieve(respObj.id), (e) => e.status === 404,
                         "an unstored answer is retrieved nowhere");
    return `worker ${respWorker}`;
  });

  // The chain: turn n names turn n-1's id; odd turns streamed, even ones not. Each turn must be
  // served by the worker that stored the previous response, see its text (the answer equals the
  // chat answer to the whole transcript, and the prompt grows by the previous answer), and hit
  // the blocks the previous turn cached there. Between turns, an unchained request shows where
  // the router sends traffic that names no response.
  const chain = [];
  await check(`responses chain of ${CHAIN_TURNS} turns (previous_response_id)`, async () => {
    const instructions = "You are a travel agent.";
    const transcript = [{ role: "system", content: instructions }];
    for (let n = 1; n <= CHAIN_TURNS; n++) {
      const prev = chain.at(-1);
      const input = `Turn ${n}: tell me more about stop number ${n} of the trip.`;
      const body = { model: MODEL, instructions, input, max_output_tokens: 6 };
      if (prev) body.previous_response_id = prev.id;
      const streamed = n % 2 === 0;
      let r, response;
      if (streamed) {
        const got = await oai.responses.create({ ...body, stream: true }).withResponse();
        response = got.response;
        for await (const ev of got.data)
          if (ev.type === "response.completed" || ev.type === "response.incomplete") r = ev.response;
        assert.ok(r, `turn ${n}: the stream's final response`);
        assert.equal(r.status, "incomplete");
        checkResponsesUsage(r.usage, 6);
      } else {
        ({ data: r, response } = await oai.responses.create(body).withResponse());
        checkResponseObject(r, 6);
      }
      const text = r.output.map((o) => o.content.map((c) => c.text).join("")).join("");
      const worker = workerOf(response);
      assert.equal(r.previous_response_id, prev ? prev.id : null, `turn ${n}: previous_response_id`);
      if (prev) {
        assert.equal(worker, prev.worker, `turn ${n} served by worker ${worker}, but ${prev.id} is stored on worker ${prev.worker}`);
        assert.ok(r.usage.input_tokens > prev.usage.input_tokens + prev.usage.output_tokens,
                  `turn ${n}: the prompt holds the previous turn (${r.usage.input_tokens} <= ` +
                  `${prev.usage.input_tokens}+${prev.usage.output_tokens})`);
        assert.ok(r.usage.input_tokens_details.cached_tokens > prev.usage.input_tokens_details.cached_tokens,
                  `turn ${n}: reads more cached blocks than turn ${n - 1}`);
      }
      transcript.push({ role: "user", content: input });
      const c = await direct[worker].chat.completions.create({ model: MODEL, messages: transcript, max_tokens: 6 });
      assert.equal(c.usage.prompt_tokens, r.usage.input_tokens, `turn ${n}: the chat prompt of the transcript`);
      assert.equal(c.choices[0].message.content, text, `turn ${n}: the chat answer to the transcript`);
      transcript.push({ role: "assistant", content: text });
      const other = await oai.responses.create({ model: MODEL, input: `Unchained request ${n}: ${"x ".repeat(n)}`,
                                                 max_output_tokens: 2, store: false }).withResponse();
      respIds.push(r.id, other.data.id);
      chain.push({ n, id: r.id, worker, streamed, usage: r.usage, text,
                   other: workerOf(other.response) });
    }
    const workers = new Set(chain.map((t) => t.worker));
    assert.equal(workers.size, 1, "a chain stays on its worker");
    return `all ${CHAIN_TURNS} turns on worker ${chain[0].worker}`;
  });
  if (chain.length) {
    console.log("\n  turn  api         worker  stored prev on  cached/input  unchained req -> worker  id");
    for (const t of chain) {
      const prev = chain[t.n - 2];
      console.log(`  ${String(t.n).padStart(4)}  ${(t.streamed ? "stream" : "create").padEnd(10)}  ` +
                  `${String(t.worker).padStart(6)}  ${String(prev ? prev.worker : "-").padStart(14)}  ` +
                  `${`${t.usage.input_tokens_details.cached_tokens}/${t.usage.input_tokens}`.padStart(12)}  ` +
                  `${String(t.other).padStart(23)}  ${t.id}`);
    }
    console.log("");
  }
  await check("Responses ids unique across the 4 workers", async () => {
    assert.equal(new Set(respIds).size, respIds.length, respIds.join(" "));
    return `${respIds.length} ids`;
  });
  await check("responses.retrieve of every chain turn (routed to the storing worker)", async () => {
    assert.equal(chain.length, CHAIN_TURNS);
    for (const t of chain) {
      const { data: g, response } = await oai.responses.retrieve(t.id).withResponse();
      assert.equal(workerOf(response), t.worker, `GET ${t.id}`);
      assert.equal(g.id, t.id);
      assert.equal(g.previous_response_id, t.n > 1 ? chain[t.n - 2].id : null);
      assert.equal(g.output[0].content[0].text, t.text);
      assert.deepEqual(g.usage, t.usage);
    }
  });

  // ---- Anthropic Messages ----
  const mbody = { model: MODEL, max_tokens: 10, system: SYSTEM,
                  messages: [{ role: "user", content: "Which river flows through Vienna, Bratislava, " +
                                                      "Budapest and Belgrade?" }] };
  let msg, msgWorker;
  // vLLM's Anthropic usage: input_tokens is the prompt less cache_read_input_tokens (in the reply
  // and message_delta), message_start's input_tokens the whole prompt; count_tokens counts the
  // whole prompt.
  let promptTokens;
  await check("anthropic messages.countTokens", async () => {
    const { data: c, response } = await ant.messages.countTokens(
      { model: MODEL, system: mbody.system, messages: mbody.messages }).withResponse();
    assert.ok(Number.isInteger(c.input_tokens) && c.input_tokens > 0);
    promptTokens = c.input_tokens;
    return `worker ${workerOf(response)}, ${promptTokens} tokens`;
  });
  await check("anthropic messages.create", async () => {
    const { data: m, response } = await ant.messages.create(mbody).withResponse();
    checkAnthropicMessage(m, 10);
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, promptTokens,
                 "input_tokens + cache_read_input_tokens = the prompt");
    assert.equal(m.usage.cache_creation_input_tokens, 0);
    assert.match(m.id, /^chatcmpl-/, "vLLM's id");
    msg = m;
    msgWorker = workerOf(response);
    return `worker ${msgWorker}, input ${m.usage.input_tokens} + cache_read ` +
           `${m.usage.cache_read_input_tokens}, output ${m.usage.output_tokens}`;
  });
  await check("anthropic messages.create stream", async () => {
    const { data: stream, response } = await ant.messages.create({ ...mbody, stream: true }).withResponse();
    const types = [];
    let text = "", start = null, delta = null;
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === "message_start") start = ev.message;
      if (ev.type === "content_block_delta") text += ev.delta.text;
      if (ev.type === "message_delta") delta = ev;
    }
    assert.deepEqual([...new Set(types)], ["message_start", "content_block_start", "content_block_delta",
                                           "content_block_stop", "message_delta", "message_stop"]);
    assert.equal(workerOf(response), msgWorker, "the repeat goes to the worker holding its prefix");
    assert.equal(start.usage.input_tokens, promptTokens, "message_start: the whole prompt");
    assert.equal(text, msg.content[0].text, "the streamed answer is the non-streamed one");
    assert.equal(delta.delta.stop_reason, "max_tokens");
    assert.equal(delta.usage.output_tokens, 10);
    assert.ok(delta.usage.cache_read_input_tokens > 0, "the same prompt again hits the cache");
    assert.equal(delta.usage.input_tokens + delta.usage.cache_read_input_tokens, promptTokens);
    return `worker ${msgWorker}, ${types.length} events, cache_read ${delta.usage.cache_read_input_tokens}`;
  });
  await check("anthropic messages.stream (helper, finalMessage)", async () => {
    const s = ant.messages.stream(mbody);
    let deltas = "";
    s.on("text", (d) => { deltas += d; });
    const m = await s.finalMessage();
    const { response } = await s.withResponse();
    checkAnthropicMessage(m, 10);
    assert.equal(workerOf(response), msgWorker, "the repeat goes to the worker holding its prefix");
    assert.equal(m.content[0].text, msg.content[0].text);
    assert.equal(deltas, msg.content[0].text);
    assert.ok(m.usage.cache_read_input_tokens > 0);
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, promptTokens);
    return `worker ${msgWorker}, cache_read ${m.usage.cache_read_input_tokens}`;
  });

  // ---- errors: a missing required field, surfaced in each API's own error class ----
  async function expectError(name, cls, status, call, checkErr) {
    await check(name, async () => {
      let err = null;
      try { await call(); } catch (e) { err = e; }
      assert.ok(err, "the call failed");
      assert.ok(err instanceof cls, `${cls.name} expected, got ${err?.constructor?.name}: ${err?.message}`);
      assert.equal(err.status, status);
      checkErr(err);
      return `${err.constructor.name} ${err.status}: ${String(err.message).split("\n")[0].slice(0, 90)}`;
    });
  }
  // The router's own 400 in OpenAI's shape: {"error": {message, type, param, code}}.
  const openaiBadRequest = (field) => (e) => {
    assert.deepEqual(Object.keys(e.error).sort(), ["code", "message", "param", "type"]);
    assert.equal(e.type, "invalid_request_error");
    assert.equal(e.code, "missing_required_parameter");
    assert.equal(e.error.message, `Missing required parameter: '${field}'.`);
  };
  await expectError("error: chat.completions without messages", OpenAI.BadRequestError, 400,
    () => oai.chat.completions.create({ model: MODEL, max_tokens: 4 }), openaiBadRequest("messages"));
  await expectError("error: chat.completions stream without messages", OpenAI.BadRequestError, 400,
    () => oai.chat.completions.create({ model: MODEL, max_tokens: 4, stream: true }), openaiBadRequest("messages"));
  await expectError("error: completions without prompt", OpenAI.BadRequestError, 400,
    () => oai.completions.create({ model: MODEL, max_tokens: 4 }), openaiBadRequest("prompt"));
  await expectError("error: responses without input", OpenAI.BadRequestError, 400,
    () => oai.responses.create({ model: MODEL }), openaiBadRequest("input"));
  await expectError("error: responses.retrieve of an unknown id", OpenAI.NotFoundError, 404,
    () => oai.responses.retrieve("resp_0123456789abcdef"),
    (e) => assert.equal(e.error.message, "Response with id 'resp_0123456789abcdef' not found."));
  await expectError("error: anthropic messages without max_tokens", Anthropic.BadRequestError, 400,
    () => ant.messages.create({ model: MODEL, messages: mbody.messages }),
    (e) => {
      // Anthropic's shape: {"type": "error", "error": {type, message}}
      assert.equal(e.error.type, "error");
      assert.equal(e.type, "invalid_request_error");
      assert.equal(e.apiMessage, "Missing required parameter: 'max_tokens'.");
    });
  await expectError("error: anthropic messages with an unknown model", Anthropic.NotFoundError, 404,
    () => ant.messages.create({ ...mbody, model: "claude-unknown" }),
    (e) => {
      // The worker's answer, passed on: vLLM's Anthropic shape, whose error.type is vLLM's class
      // name (NotFoundError) where Anthropic's API says not_found_error.
      assert.equal(e.error.type, "error");
      assert.equal(e.type, "NotFoundError");
      assert.equal(e.apiMessage, "The model `claude-unknown` does not exist.");
    });

  const elapsed = Date.now() - t0;
  await check(`run time under ${DEADLINE_MS / 1000} s`, async () => {
    assert.ok(elapsed < DEADLINE_MS, `${elapsed} ms`);
    return `${(elapsed / 1000).toFixed(1)} s`;
  });
}

try {
  await main();
} catch (err) {
  failed++;
  console.log(`FAIL setup: ${err && err.stack ? err.stack : err}`);
} finally {
  const problems = await stopAll();
  await check("every process ran to the end and exited 0 on SIGTERM", async () => {
    assert.deepEqual(problems, []);
  });
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
