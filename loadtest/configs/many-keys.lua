-- wrk: every request with its own value of `x-k` among 10,000 (for limits keyed on
-- header:x-k), round robin. Used as WRK_SCRIPT=loadtest/configs/many-keys.lua.
local n = 0
request = function()
  n = n + 1
  return wrk.format(nil, nil, { ["x-k"] = "k" .. (n % 10000) })
end
