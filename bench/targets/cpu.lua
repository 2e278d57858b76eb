-- A CPU-bound Lua workload for `bench/seeds iprobe` (run by bench/targets/luahost.c):
-- recursive calls, table churn and sorting through a comparator, string building and
-- pattern matching; SCALE (arg[1], default 1) multiplies the work. Prints a checksum.
local scale = tonumber(arg and arg[1]) or 1
local function fib(n) if n < 2 then return n end return fib(n - 1) + fib(n - 2) end
local sum = 0
for _ = 1, scale do
  sum = sum + fib(24)
  local t, x = {}, 12345
  for i = 1, 60000 do x = (x * 1103515245 + 12345) % 2147483648; t[i] = x end
  table.sort(t, function(a, b) return a > b end)
  sum = (sum + t[1] + t[#t]) % 1000000007
  local parts = {}
  for i = 1, 20000 do parts[#parts + 1] = string.format("k%d=%x", i, i * 7) end
  local s = table.concat(parts, ";")
  for k, v in s:gmatch("k(%d+)=(%x+)") do sum = (sum + tonumber(k) + tonumber(v, 16)) % 1000000007 end
end
print("checksum=" .. sum)
