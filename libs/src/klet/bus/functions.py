"""klet's server-side bus operations, as one Redis Function library (Redis 7).

A fenced write must compare the lease and write in one atomic step, and so must taking,
renewing and releasing a lease; Redis runs such steps as Lua. Services used to send the
Lua themselves (EVAL), which meant any service credential could run any script: one
that loops blocks every client of that Redis (`BUSY`, and a script that wrote cannot be
killed), Lua allocations escape `maxmemory`, and the Lua engine's own defects become
reachable from the least-privileged user. Instead, the set-up step that holds the admin
credential loads this library once (`FUNCTION LOAD REPLACE`: `klet up`, the dev stack,
the bundled Redis's start script, or `klet bus-acl --apply` on an operator's Redis), and
each service user may `FCALL` these functions by name and nothing else of Lua
(klet.bus.acl). Inside a function every `redis.call` is still checked against the
calling user's ACL, so a function lets a service do nothing it could not do directly.

The library's name carries a digest of its text, so a changed library is a new name: a
node upgraded while another still runs the old release finds its own functions, and a
stale library never answers for a newer one. A Redis that restarted empty has no
functions until they are loaded again; the services meanwhile get `BusUnavailable`
(klet.bus.redisbus) and retry.

Bounded calls. Redis runs a function to its end while every other client of that Redis
waits (`BUSY` after the busy threshold, 5 s), and a function that has written cannot be
killed. So the fenced write refuses, before its first write and before even reading
the lease, a call larger than the caps below (`KLETCAP <cap> ...`, which
klet.bus.redisbus raises as `WriteTooLarge` naming the cap): at most `MAX_WRITE_OPS`
writes and `MAX_WRITE_BYTES` of keys and arguments per call, no table value above
`MAX_VALUE_BYTES`, no stream entry above `MAX_ENTRY_BYTES`, no stream longer than
`MAX_STREAM_LEN` (every XADD trims to its MAXLEN), no expiry beyond `MAX_EXPIRE_MS`.
Every argument is checked the same way first (a MAXLEN that is not a positive integer,
an op without its arguments, a key index outside KEYS or naming the lease itself:
`KLETARG ...`, raised as `BadWrite`), so a malformed call writes nothing; taking and
renewing a lease check their TTL the same way before drawing a token. One
service's largest legitimate write is pod-source's reconcile of every pod of the node
(two ops a pod, a few KiB each), far below the caps.

What each writer owns, beyond its keys. Redis grants a key, not a hash field, so a
service's grant on its own `node:<service>` table would let it write any condition
type there (eviction `Ready=False` for a reason of its choosing). The fenced write
therefore refuses, before its first write, a row of `node:<service>` that is not one of
`CONDITION_TYPES[service]`, whose record does not name the type it is keyed by, or
(eviction's Ready) that is not the graceful shutdown's `False` (`KLETOWN ...`, raised as
`NotOwned`). And an append to a pod's history (`history:<uid>`, the only keys a glob
grants) must carry that stream's expiry in the same call, so no history key the
function writes lives without end. The readers check the conditions again
(klet.bus.schema.NodeConditions), since the direct commands stay granted (below).

What a function cannot do: act beyond the caller's ACL. Redis checks every `redis.call`
inside a function against the calling user's grants, so a user without XADD cannot
XADD through a function either (tests/integration/test_bus_caps.py shows it), and the
grants that let the functions write also let the same user send those commands
directly. The caps bound the function path, where one call could stall every node; a
single direct command is bounded only by the server's own limits.

Table generations. Every call that writes a table (`klet:<node>:<table>`, a hash) also
moves that table's generation counter, `klet:<node>:gen:<table>`, in the same atomic
step, once per call: a reader that keeps a copy of a table reads the counter (one GET,
or one MGET for several tables) and reads and decodes the table again only when it
moved (klet.bus.tablecopy). A counter that does not exist yet, or that Redis lost with
its data, starts from the Redis server's clock in microseconds (`TIME`), not from 1: a
reader holding a value from before a Redis restart can then never find the new counter
at the same value (it would need more writes than microseconds had passed), so a
restart always reads as "moved". A counter that is not a number any more is set afresh
the same way, so a broken counter costs its readers one full read, never a write.

This module is pure text (no `redis` import): the ACL grants and the loaders share it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from string import Template

from klet.model.node import NODE_SHUTTING_DOWN

MAX_WRITE_OPS = 5000
"""Writes (HSET, HDEL, XADD, PEXPIRE) in one fenced-write call."""
MAX_WRITE_BYTES = 32 * 1024 * 1024
"""Bytes of keys and arguments in one fenced-write call."""
MAX_VALUE_BYTES = 4 * 1024 * 1024
"""Bytes of one table value (a desired pod's record is the largest)."""
MAX_ENTRY_BYTES = 64 * 1024
"""Bytes of one stream entry (Events, change notices, history entries)."""
MAX_STREAM_LEN = 100_000
"""The largest MAXLEN an XADD may ask for (klet's streams keep 10,000 at most)."""
MAX_EXPIRE_MS = 90 * 24 * 3600 * 1000
"""The longest expiry a write may set (a pod's history keeps days, not months)."""

CAPS = {
    "MAX_WRITE_OPS": MAX_WRITE_OPS,
    "MAX_WRITE_BYTES": MAX_WRITE_BYTES,
    "MAX_VALUE_BYTES": MAX_VALUE_BYTES,
    "MAX_ENTRY_BYTES": MAX_ENTRY_BYTES,
    "MAX_STREAM_LEN": MAX_STREAM_LEN,
    "MAX_EXPIRE_MS": MAX_EXPIRE_MS,
}
CAP_PREFIX = "KLETCAP"
"""The error code of a call refused by a cap (`KLETCAP <cap name> <why>`)."""
BAD_ARGUMENT_PREFIX = "KLETARG"
"""The error code of a malformed call (`KLETARG <why>`)."""
NOT_OWNED_PREFIX = "KLETOWN"
"""The error code of a write of something its writer does not own (`KLETOWN <why>`)."""

CONDITION_TYPES: Mapping[str, frozenset[str]] = {
    "syncloop": frozenset({"Ready"}),
    "eviction": frozenset({"MemoryPressure", "DiskPressure", "PIDPressure", "Ready"}),
}
"""The node condition types each service may contribute, in its own `node:<service>`:
syncloop's Ready (False while PLEG is unhealthy); eviction's pressures, and Ready
(False while the node shuts down, and nothing else: `CONDITION_FIXED`). The fenced
write refuses any other row, and the readers leave one out (klet.bus.schema)."""

CONDITION_FIXED: Mapping[tuple[str, str], tuple[str, str]] = {
    ("eviction", "Ready"): ("False", NODE_SHUTTING_DOWN),
}
"""(service, type) -> the only (status, message) that service may give that type."""

JOURNAL_PREFIX = "history:"
"""Streams (one per pod, under a key glob) whose every append must carry their expiry."""

GENERATION_PREFIX = "gen:"
"""A table `<table>`'s generation counter is the key `gen:<table>` (after `klet:<node>:`),
moved by every fenced write of the table (above)."""


def generation_name(table: str) -> str:
    """The generation counter's name (after `klet:<node>:`) of the table `table`."""
    return GENERATION_PREFIX + table


def _lua(value: str) -> str:
    """A Lua string literal of `value` (JSON's escapes are Lua's for these strings)."""
    return json.dumps(value, ensure_ascii=True)


def _lua_conditions() -> str:
    """CONDITION_TYPES and CONDITION_FIXED as a Lua table: service -> type -> true, or
    {status, message} where the type is fixed."""
    services = []
    for service, types in sorted(CONDITION_TYPES.items()):
        rows = []
        for type_ in sorted(types):
            fixed = CONDITION_FIXED.get((service, type_))
            rule = "true" if fixed is None else f"{{{_lua(fixed[0])}, {_lua(fixed[1])}}}"
            rows.append(f"[{_lua(type_)}] = {rule}")
        services.append(f"[{_lua(service)}] = {{{', '.join(rows)}}}")
    return "{" + ", ".join(services) + "}"


def _lua_condition_names() -> str:
    """Each service's condition types, listed for an error message."""
    rows = (
        f"[{_lua(service)}] = {_lua(', '.join(sorted(types)))}"
        for service, types in sorted(CONDITION_TYPES.items())
    )
    return "{" + ", ".join(rows) + "}"


# Every function takes the lease (or stream) keys in KEYS and its values in ARGV, the
# calling convention of FCALL. Replies starting FENCED or LAPSED are fencing verdicts
# (klet.bus.redisbus turns them into Fenced and LeaseLapsed).
_BODY = Template("""
-- KEYS[1] is the lease, KEYS[2..] the keys written; ARGV[1] is the writer's lease
-- value, then the ops: verb, index of its key in KEYS, arguments. The comparison and
-- the writes are one step, so nothing can take the lease in between. A lease held by
-- the same holder under another token (a write prepared before the leader took the
-- lease back after Redis lost it) is "lapsed", to be retried, not "fenced": holder IDs
-- are unique per process, so no other process can have written in between.
-- Redis has no rollback: a write refused half-way leaves the earlier ones applied. So
-- every write is checked first against what can refuse it: its arguments and the caps
-- (check_write), the caller's ACL (redis.acl_check_cmd) and the key's type (all but the
-- first write's, which fails with nothing written). Memory
-- cannot refuse one half-way: Redis checks maxmemory before a function that may write
-- starts.
local width = {hset = 4, hdel = 3, xadd = 4, pexpire = 3}

local function cap(name, why)
  return redis.error_reply('KLETCAP ' .. name .. ' ' .. why)
end

local function bad(why)
  return redis.error_reply('KLETARG ' .. why)
end

local function not_owned(why)
  return redis.error_reply('KLETOWN ' .. why)
end

-- Each condition writer's types in its own node:<service> (klet.bus.functions).
local conditions = $CONDITIONS
local condition_names = $CONDITION_NAMES

-- A quoted, shortened argument for an error message.
local function shown(s)
  if #s > 40 then
    return string.format('%q...', string.sub(s, 1, 40))
  end
  return string.format('%q', s)
end

-- A positive decimal integer, or nil (Lua's tonumber takes "1e3", "0x10", " 7").
local function positive(s)
  if #s > 15 or not string.match(s, '^[1-9][0-9]*$$') then
    return nil
  end
  return tonumber(s)
end

-- Every argument and every cap, before anything is read or written; an error reply or
-- nil. The work done here is itself bounded: the argument count is checked first.
-- A pod's history (klet:<node>:history:<uid>): each append carries its expiry.
local function journal(key)
  return string.match(key, '^klet:[^:]+:$JOURNAL_PREFIX') ~= nil
end

-- A row of klet:<node>:node:<service> is a condition that service owns, keyed by its
-- type, and (where the type is fixed) the one status and message it may give it; an
-- error reply or nil. Any other key is not a condition table.
local function check_condition(key, field, value)
  local service = string.match(key, '^klet:[^:]+:node:(.+)$$')
  if not service then
    return nil
  end
  local owned = conditions[service]
  if not owned then
    return not_owned('node:' .. service .. ' holds no conditions')
  end
  if not owned[field] then
    return not_owned('node:' .. service .. ' holds only ' .. condition_names[service]
      .. ' conditions, not ' .. shown(field))
  end
  local rule = owned[field]
  local ok, record = pcall(cjson.decode, value)
  if not ok or type(record) ~= 'table' or record['type'] ~= field then
    return not_owned('node:' .. service .. ' row ' .. shown(field)
      .. ' is not a condition record of that type')
  end
  if rule ~= true and (record['status'] ~= rule[1] or record['message'] ~= rule[2]) then
    return not_owned('node:' .. service .. ' may set ' .. field .. ' only to ' .. rule[1]
      .. ' ' .. shown(rule[2]))
  end
  return nil
end

local function check_write(keys, argv)
  if #argv - 1 > 4 * $MAX_WRITE_OPS or #keys - 1 > $MAX_WRITE_OPS then
    return cap('MAX_WRITE_OPS', #argv .. ' arguments are more than $MAX_WRITE_OPS writes')
  end
  local bytes = 0
  for _, k in ipairs(keys) do
    bytes = bytes + #k
  end
  for _, a in ipairs(argv) do
    bytes = bytes + #a
  end
  if bytes > $MAX_WRITE_BYTES then
    return cap('MAX_WRITE_BYTES', bytes .. ' bytes in one call, at most $MAX_WRITE_BYTES')
  end
  if #argv < 1 or #keys < 1 then
    return bad('a fenced write needs the lease key and value')
  end
  local ops, i = 0, 2
  local appended, expired = {}, {}
  while i <= #argv do
    local verb = argv[i]
    local w = width[verb]
    if not w then
      return bad('unknown bus write ' .. shown(verb) .. ' at argument ' .. i)
    end
    if i + w - 1 > #argv then
      return bad(verb .. ' at argument ' .. i .. ' lacks its arguments')
    end
    local k = positive(argv[i + 1])
    if not k or k < 2 or k > #keys then
      return bad(verb .. ' at argument ' .. i .. ' names key ' .. shown(argv[i + 1])
        .. ', not one of KEYS[2..' .. #keys .. ']')
    end
    if verb == 'xadd' then
      local maxlen = positive(argv[i + 2])
      if not maxlen then
        return bad('xadd MAXLEN ' .. shown(argv[i + 2]) .. ' is not a positive integer')
      end
      if maxlen > $MAX_STREAM_LEN then
        return cap('MAX_STREAM_LEN', 'xadd MAXLEN ' .. maxlen .. ', at most $MAX_STREAM_LEN')
      end
      if #argv[i + 3] > $MAX_ENTRY_BYTES then
        return cap('MAX_ENTRY_BYTES', 'a stream entry of ' .. #argv[i + 3]
          .. ' bytes, at most $MAX_ENTRY_BYTES')
      end
    elseif verb == 'pexpire' then
      local ms = positive(argv[i + 2])
      if not ms then
        return bad('pexpire ' .. shown(argv[i + 2]) .. ' is not a positive integer')
      end
      if ms > $MAX_EXPIRE_MS then
        return cap('MAX_EXPIRE_MS', 'an expiry of ' .. ms .. ' ms, at most $MAX_EXPIRE_MS')
      end
    elseif verb == 'hset' and #argv[i + 3] > $MAX_VALUE_BYTES then
      return cap('MAX_VALUE_BYTES', 'a table value of ' .. #argv[i + 3]
        .. ' bytes, at most $MAX_VALUE_BYTES')
    end
    if verb == 'xadd' and journal(keys[k]) then
      appended[k] = i
    elseif verb == 'pexpire' then
      expired[k] = true
    end
    ops = ops + 1
    i = i + w
  end
  if ops > $MAX_WRITE_OPS then
    return cap('MAX_WRITE_OPS', ops .. ' writes in one call, at most $MAX_WRITE_OPS')
  end
  for k, at in pairs(appended) do
    if not expired[k] then
      return bad('xadd at argument ' .. at .. ' appends to ' .. keys[k]
        .. ' without its expiry (a pexpire of it in the same call)')
    end
  end
  -- What the writer owns, once the whole call is known to be well formed.
  i = 2
  while i <= #argv do
    if argv[i] == 'hset' then
      local refused = check_condition(keys[tonumber(argv[i + 1])], argv[i + 2], argv[i + 3])
      if refused then
        return refused
      end
    end
    i = i + width[argv[i]]
  end
  return nil
end

-- The generation counter of a table key (klet:<node>:gen:<table>), nil for a key
-- outside klet's naming.
local function generation_key(key)
  local prefix, name = string.match(key, '^(klet:[^:]+:)(.+)$$')
  if not prefix then
    return nil
  end
  return prefix .. '$GENERATION_PREFIX' .. name
end

-- Move a table's generation: INCR, or, for a counter that is new (lost with Redis's
-- data) or not a number, the server's clock in microseconds, above any value a reader
-- can hold from before. Never fails once the ACL check passed: SET takes any key.
local function bump(g)
  local n = redis.pcall('INCR', g)
  if type(n) ~= 'number' or n == 1 then
    local t = redis.call('TIME')
    redis.call('SET', g, t[1] .. string.format('%06d', tonumber(t[2])))
  end
end

local function wrong_type(key, t, kind)
  return redis.error_reply('WRONGTYPE ' .. key .. ' holds a ' .. t .. ', not a ' .. kind)
end

local function fenced_write(keys, argv)
  local refused = check_write(keys, argv)
  if refused then
    return refused
  end
  local holder = redis.call('GET', keys[1])
  if holder ~= argv[1] then
    if not holder then
      return redis.error_reply('LAPSED lease ' .. keys[1] .. ' is held by nobody')
    end
    local me = string.match(argv[1], '^(.*:)[^:]*$$')
    if me and string.sub(holder, 1, string.len(me)) == me then
      return redis.error_reply('LAPSED lease ' .. keys[1] .. ' was granted to this holder again')
    end
    return redis.error_reply('FENCED lease ' .. keys[1] .. ' is not held by ' .. argv[1])
  end
  -- The key types, before the first write, so that no write fails half-way on a key
  -- of another type. A key is looked at (TYPE) once a call, and what each write makes
  -- of it is remembered: a later write of another type to a key the call has already
  -- made a table or a stream is refused too, which looking at the key alone would let
  -- through. The call's first write is not looked at: should it fail, nothing has been
  -- written (the common write, an append to a pod's history with its expiry, then needs
  -- no TYPE at all). pexpire takes any type: it bounds the life of a key the call wrote.
  local kinds = {hset = 'hash', hdel = 'hash', xadd = 'stream'}
  local sample = {
    hset = {'HSET', 'f', 'v'}, hdel = {'HDEL', 'f'}, xadd = {'XADD', '*', 'r', 'v'},
    pexpire = {'PEXPIRE', '1'}
  }
  local known = {}
  -- The generation counters of the tables this call writes, each moved once, after the
  -- writes (checked against the ACL here, with the writes).
  local generations, bumped = {}, {}
  local i = 2
  while i <= #argv do
    local verb, key = argv[i], keys[tonumber(argv[i + 1])]
    local kind = kinds[verb]
    if kind then
      local t = known[key]
      if t == nil and i > 2 then
        t = redis.call('TYPE', key)['ok']
      end
      if t ~= nil and t ~= 'none' and t ~= kind then
        return wrong_type(key, t, kind)
      end
      -- hset and xadd leave the key a table or a stream; hdel leaves it as it was.
      if verb ~= 'hdel' then
        known[key] = kind
      else
        known[key] = t
      end
    end
    local s = sample[verb]
    if not redis.acl_check_cmd(s[1], key, unpack(s, 2)) then
      return redis.error_reply('NOPERM this user may not ' .. s[1] .. ' ' .. key)
    end
    if kind == 'hash' then
      local g = generation_key(key)
      if g and not bumped[g] then
        if not (redis.acl_check_cmd('INCR', g) and redis.acl_check_cmd('SET', g, '1')) then
          return redis.error_reply('NOPERM this user may not move the generation ' .. g)
        end
        bumped[g] = true
        generations[#generations + 1] = g
      end
    end
    i = i + width[verb]
  end
  local out = {}
  i = 2
  while i <= #argv do
    local verb, key = argv[i], keys[tonumber(argv[i + 1])]
    local reply
    if verb == 'hset' then
      reply = redis.pcall('HSET', key, argv[i + 2], argv[i + 3])
    elseif verb == 'hdel' then
      reply = redis.pcall('HDEL', key, argv[i + 2])
    elseif verb == 'pexpire' then
      reply = redis.pcall('PEXPIRE', key, argv[i + 2])
    else
      reply = redis.pcall('XADD', key, 'MAXLEN', '~', argv[i + 2], '*', 'r', argv[i + 3])
    end
    if type(reply) == 'table' and reply['err'] then
      -- Only the first write gets here on a key of another type, with nothing written.
      if string.sub(reply['err'], 1, 9) == 'WRONGTYPE' then
        return wrong_type(key, redis.call('TYPE', key)['ok'], kinds[verb])
      end
      return reply
    end
    if verb == 'xadd' then
      out[#out + 1] = reply
    else
      out[#out + 1] = ''
    end
    i = i + width[verb]
  end
  for _, g in ipairs(generations) do
    bump(g)
  end
  return out
end

-- KEYS[1] the lease; ARGV: the holder's value, the TTL (ms).
local function lease_renew(keys, argv)
  local ttl = positive(argv[2] or '')
  if not ttl then
    return bad('lease_renew takes a TTL in ms')
  end
  if ttl > $MAX_EXPIRE_MS then
    return cap('MAX_EXPIRE_MS', 'a lease TTL of ' .. ttl .. ' ms, at most $MAX_EXPIRE_MS')
  end
  if redis.call('GET', keys[1]) == argv[1] then
    return redis.call('PEXPIRE', keys[1], argv[2])
  end
  return 0
end

-- KEYS: lease, fence counter. ARGV: "<holder>:", "<heir of>:" or "", TTL (ms).
-- Take the lease when it is free, or held by this process under an older token, or by
-- a process known to be dead (the predecessor of this replica slot, or the leader a
-- vacated leader slot names). Holder IDs end in a fixed-length random part, so a prefix
-- match is an exact match of the holder. The token is drawn only when the lease is
-- granted: the fence counter is the last token granted. The reply says whether the
-- counter existed: if not, Redis lost it (restart, flush) and this is the first grant.
local function lease_acquire(keys, argv)
  -- The TTL first: a bad one failed the SET after the INCR had drawn a token.
  local ttl = positive(argv[3] or '')
  if #keys ~= 2 or not ttl then
    return bad('lease_acquire takes the lease and its fence counter, and a TTL in ms')
  end
  if ttl > $MAX_EXPIRE_MS then
    return cap('MAX_EXPIRE_MS', 'a lease TTL of ' .. ttl .. ' ms, at most $MAX_EXPIRE_MS')
  end
  local cur = redis.call('GET', keys[1])
  if cur then
    local mine = string.sub(cur, 1, string.len(argv[1])) == argv[1]
    local heir = argv[2] ~= '' and string.sub(cur, 1, string.len(argv[2])) == argv[2]
    if not (mine or heir) then
      return 0
    end
  end
  local continued = redis.call('EXISTS', keys[2])
  local token = redis.call('INCR', keys[2])
  redis.call('SET', keys[1], argv[1] .. token, 'PX', argv[3])
  return {token, continued}
end

-- KEYS[1] the lease; ARGV[1] the holder's value.
local function lease_release(keys, argv)
  if redis.call('GET', keys[1]) == argv[1] then
    return redis.call('DEL', keys[1])
  end
  return 0
end

-- KEYS[1] the stream; ARGV: group, the calling consumer (kept), minimum idle time (ms).
-- Deleting a consumer drops its pending entries, so only consumers with none go, and
-- the check and the delete are one step: nobody can read in between.
local function forget_consumers(keys, argv)
  local removed = {}
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', keys[1], argv[1])) do
    local f = {}
    for i = 1, #c, 2 do
      f[c[i]] = c[i + 1]
    end
    if f['name'] ~= argv[2] and tonumber(f['pending']) == 0
        and tonumber(f['idle']) >= tonumber(argv[3]) then
      redis.call('XGROUP', 'DELCONSUMER', keys[1], argv[1], f['name'])
      removed[#removed + 1] = f['name']
    end
  end
  return removed
end
""").substitute(
    {name: str(value) for name, value in CAPS.items()},
    CONDITIONS=_lua_conditions(),
    CONDITION_NAMES=_lua_condition_names(),
    JOURNAL_PREFIX=JOURNAL_PREFIX,
    GENERATION_PREFIX=GENERATION_PREFIX,
)

_ROLES = ("fenced_write", "lease_renew", "lease_acquire", "lease_release", "forget_consumers")

LIBRARY = "klet_" + hashlib.sha256(_BODY.encode()).hexdigest()[:12]
"""The library's name, versioned by its text."""


def function_name(role: str) -> str:
    """The registered name of one of the library's functions (`fenced_write`, ...)."""
    if role not in _ROLES:
        raise ValueError(f"no bus function {role!r} (one of {', '.join(_ROLES)})")
    return f"{LIBRARY}_{role}"


FENCED_WRITE = function_name("fenced_write")
LEASE_RENEW = function_name("lease_renew")
LEASE_ACQUIRE = function_name("lease_acquire")
LEASE_RELEASE = function_name("lease_release")
FORGET_CONSUMERS = function_name("forget_consumers")
FUNCTIONS = tuple(function_name(role) for role in _ROLES)


def library_code() -> str:
    """The text `FUNCTION LOAD REPLACE` takes: the shebang naming the library, the
    functions, their registrations."""
    registrations = "\n".join(
        f"redis.register_function('{function_name(role)}', {role})" for role in _ROLES
    )
    return f"#!lua name={LIBRARY}\n{_BODY}\n{registrations}\n"
