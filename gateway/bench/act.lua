-- wrk script: POST /v1/act to the demo service, a unique x-request-id per request.
-- Usage: GW_KEY=ak_... wrk -t1 -c16 -d15s --latency -s gateway/bench/act.lua http://HOST:PORT
-- Ids count from 1 in each wrk thread: use -t1 when ids must be unique.
local counter = 0
local key = os.getenv("GW_KEY")
local body = '{"service":"demo","action":"echo","on_behalf_of":"user-1","params":{"n":1}}'
request = function()
  counter = counter + 1
  local headers = {}
  headers["authorization"] = "Bearer " .. key
  headers["content-type"] = "application/json"
  headers["x-request-id"] = tostring(counter)
  return wrk.format("POST", "/v1/act", headers, body)
end
