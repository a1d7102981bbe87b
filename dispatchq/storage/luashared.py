"""Lua functions more than one of the store's scripts needs, written once.

Prepended to a script's text (Redis runs each script on its own: there is no shared library
to load in the Redis versions dispatchq supports).
"""

from __future__ import annotations

__all__ = ["JOB_FILTER_LUA", "ZADD_ALL_LUA"]

# `zadd_all(key, score, ids)`: every id of a list at one score, 500 members a command (Lua's
# `unpack` has a limit; one ZADD per id costs a call each).
ZADD_ALL_LUA = """
local function zadd_all(key, score, ids)
  for i = 1, #ids, 500 do
    local scored = {}
    for j = i, math.min(i + 499, #ids) do
      scored[#scored + 1] = score
      scored[#scored + 1] = ids[j]
    end
    redis.call('ZADD', key, unpack(scored))
  end
end
"""

# `kept_job(job, wanted, seen)`: reconciliation's filter of candidate records. With `wanted`
# "*", one record per distinct job (every record with none); with ",job1,job2,", every record
# of those jobs. `seen` is the caller's table of jobs already kept.
JOB_FILTER_LUA = """
local function kept_job(job, wanted, seen)
  if wanted == '*' then
    local keep = job == '' or not seen[job]
    seen[job] = true
    return keep
  end
  return string.find(wanted, ',' .. job .. ',', 1, true) ~= nil
end
"""
