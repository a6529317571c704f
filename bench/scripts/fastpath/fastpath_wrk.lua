-- fastpath_wrk.lua -- the requests of bench/scripts/fastpath/fastpath.sh, and one machine-readable
-- result line.
--
-- Experiment fastpath (bench/results/fastpath/): wrk's output with this line is what fastpath.sh
-- keeps as OUT/raw/wrk_<row>_<target>_r<round>.txt; the script writes no file itself.
--
-- wrk runs this once per thread: init(args) builds the one request every connection repeats, from the
-- script arguments after `--`:
--   get                    GET /v1/models
--   post BYTES             POST /v1/chat/completions, a chat body of BYTES bytes in total (the user
--                          message is padded with words until the body is exactly BYTES long; a body
--                          smaller than the fixed part is sent unpadded)
-- done() prints one line "FASTPATH_RESULT {json}" after wrk's own summary: requests, duration, p50/p99
-- latency and the error counters (errors.status counts responses with status > 399, as wrk's
-- "Non-2xx or 3xx responses" line does). fastpath.sh fails the run when any error counter is non-zero.

local function chat_body(bytes)
  local head = '{"model":"fastpath","max_tokens":16,"messages":[{"role":"user","content":"'
  local tail = '"}]}'
  local words = { "router ", "cache ", "prefix ", "token ", "block ", "worker ", "stream " }
  local need = bytes - #head - #tail
  local parts, have, i = {}, 0, 0
  while have < need do
    local w = words[(i % #words) + 1]
    if have + #w > need then
      w = string.rep("x", need - have)
    end
    parts[#parts + 1] = w
    have = have + #w
    i = i + 1
  end
  if #parts == 0 then
    parts[1] = "What is the capital of France?"
  end
  return head .. table.concat(parts) .. tail
end

function init(args)
  local mode = args[1] or "get"
  if mode == "get" then
    wrk.method = "GET"
    wrk.path = "/v1/models"
  elseif mode == "post" then
    wrk.method = "POST"
    wrk.path = "/v1/chat/completions"
    wrk.headers["Content-Type"] = "application/json"
    wrk.body = chat_body(tonumber(args[2] or "0"))
  else
    error("fastpath_wrk.lua: unknown mode '" .. mode .. "' (get | post BYTES)")
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'FASTPATH_RESULT {"requests":%d,"duration_us":%d,"bytes":%d,"p50_us":%d,"p99_us":%d,' ..
    '"mean_us":%.1f,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}\n',
    summary.requests, summary.duration, summary.bytes, latency:percentile(50),
    latency:percentile(99), latency.mean, e.connect, e.read, e.write, e.status, e.timeout))
end
