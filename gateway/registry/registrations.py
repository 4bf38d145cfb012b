"""The registered-model set that replicas share, in Redis (REDIS_URL). Every key starts with `prefix`:

    <p>models       hash  model id -> JSON registration {model_name, pretrained, kind, version, by, at}
    <p>lru          zset  model id -> when it was last used anywhere (epoch s): the cluster-wide LRU order
    <p>ready_at     hash  model id -> when a replica first had it ready (a loading model is not evicted)
    <p>replicas     zset  replica id -> its last heartbeat (epoch s); live = heartbeat within the TTL
    <p>ready:<id>   set   the model ids ready on that replica (expires with its heartbeat)
    <p>events       pub/sub channel: a JSON {op, id, by} after every change (replicas reconcile on it)

The cap (MAX_LOADED_MODELS) and the LRU eviction are decided in one Lua script (`REGISTER`), which Redis
runs atomically: two replicas registering at the same moment cannot both pass the cap."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import redis.asyncio as aioredis

# KEYS: models, lru, ready_at. ARGV: id, registration JSON, cap, now, loading grace (s).
# Returns {"exists", stored JSON} | {"full", ""} | {"added", evicted id or ""}.
REGISTER = """
local found = redis.call('HGET', KEYS[1], ARGV[1])
if found then return {'exists', found} end
local cap = tonumber(ARGV[3])
local victim = ''
if redis.call('HLEN', KEYS[1]) >= cap then
  local now, grace = tonumber(ARGV[4]), tonumber(ARGV[5])
  for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    local info = redis.call('HGET', KEYS[1], id)
    if info then
      local at = tonumber(cjson.decode(info)['at'])
      if redis.call('HEXISTS', KEYS[3], id) == 1 or now - at > grace then victim = id break end
    else
      redis.call('ZREM', KEYS[2], id)
    end
  end
  if victim == '' then return {'full', ''} end
  redis.call('HDEL', KEYS[1], victim)
  redis.call('ZREM', KEYS[2], victim)
  redis.call('HDEL', KEYS[3], victim)
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
return {'added', victim}
"""


@dataclass(frozen=True)
class Registration:
    model_name: str
    pretrained: str | None
    kind: str
    version: int = 0  # raised by a replace: every replica loads the model again
    by: str = ""  # the replica that took the call, and the key id when keys are on
    at: float = 0.0

    @property
    def id(self) -> str:
        return f"{self.model_name}|{self.pretrained}" if self.pretrained else self.model_name

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def loads(cls, text: str | bytes) -> "Registration":
        data = json.loads(text)
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


class RedisRegistrations:
    def __init__(self, url: str, prefix: str = "triton-pipelines:", heartbeat_ttl_s: float = 10.0):
        self.url, self.prefix, self.ttl = url, prefix, heartbeat_ttl_s
        self.redis = aioredis.Redis.from_url(url, decode_responses=True, socket_timeout=5, socket_connect_timeout=5,
                                             health_check_interval=30)
        self._register = self.redis.register_script(REGISTER)
        self.channel = prefix + "events"

    def _k(self, name: str) -> str:
        return self.prefix + name

    async def close(self) -> None:
        await self.redis.aclose()

    # ---- the registered set ---------------------------------------------------------------------
    async def register(self, reg: Registration, cap: int, loading_grace_s: float) -> tuple[str, Registration | str]:
        """("added", evicted id or ""), ("exists", the stored registration) or ("full", "")."""
        status, value = await self._register(keys=[self._k("models"), self._k("lru"), self._k("ready_at")],
                                             args=[reg.id, reg.dumps(), cap, time.time(), loading_grace_s])
        if status == "exists":
            return status, Registration.loads(value)
        if status == "added":
            await self.publish("register", reg.id, reg.by)
            if value:
                await self.publish("unregister", value, reg.by)
        return status, value

    async def bump_version(self, reg: Registration) -> Registration:
        """A replace: the stored registration with its version raised (every replica loads it again)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(self._k("models"))
                    found = await pipe.hget(self._k("models"), reg.id)
                    new = Registration(reg.model_name, reg.pretrained, reg.kind,
                                       (Registration.loads(found).version if found else 0) + 1, reg.by, time.time())
                    pipe.multi()
                    pipe.hset(self._k("models"), reg.id, new.dumps())
                    pipe.zadd(self._k("lru"), {reg.id: new.at})
                    await pipe.execute()
                    break
                except aioredis.WatchError:
                    continue
        await self.publish("replace", reg.id, reg.by)
        return new

    async def unregister(self, model_id: str, by: str, op: str = "unregister") -> bool:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self._k("models"), model_id)
            pipe.zrem(self._k("lru"), model_id)
            pipe.hdel(self._k("ready_at"), model_id)
            removed = (await pipe.execute())[0]
        await self.publish(op, model_id, by)
        return bool(removed)

    async def get(self, model_id: str) -> Registration | None:
        found = await self.redis.hget(self._k("models"), model_id)
        return Registration.loads(found) if found else None

    async def all(self) -> dict[str, Registration]:
        return {k: Registration.loads(v) for k, v in (await self.redis.hgetall(self._k("models"))).items()}

    async def publish(self, op: str, model_id: str, by: str) -> None:
        await self.redis.publish(self.channel, json.dumps({"op": op, "id": model_id, "by": by}))

    # ---- replicas, readiness and use --------------------------------------------------------------
    async def heartbeat(self, replica: str, ready: set[str], used: dict[str, float]) -> None:
        """This replica is alive, has these models ready, and used these (id -> epoch s) lately."""
        now = time.time()
        key = self._k(f"ready:{replica}")
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zadd(self._k("replicas"), {replica: now})
            pipe.zremrangebyscore(self._k("replicas"), 0, now - 10 * self.ttl)  # long gone: forgotten
            pipe.delete(key)
            if ready:
                pipe.sadd(key, *ready)
            pipe.expire(key, max(1, int(self.ttl)))
            for model_id in ready:
                pipe.hsetnx(self._k("ready_at"), model_id, now)
            if used:
                pipe.zadd(self._k("lru"), used, xx=True, gt=True)
            await pipe.execute()

    async def leave(self, replica: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zrem(self._k("replicas"), replica)
            pipe.delete(self._k(f"ready:{replica}"))
            await pipe.execute()

    async def live_replicas(self) -> list[str]:
        return sorted(await self.redis.zrangebyscore(self._k("replicas"), time.time() - self.ttl, "+inf"))

    async def ready_on(self) -> dict[str, list[str]]:
        """Model id -> the live replicas where it is ready."""
        replicas = await self.live_replicas()
        if not replicas:
            return {}
        async with self.redis.pipeline(transaction=False) as pipe:
            for replica in replicas:
                pipe.smembers(self._k(f"ready:{replica}"))
            sets = await pipe.execute()
        where: dict[str, list[str]] = {}
        for replica, models in zip(replicas, sets):
            for model_id in models:
                where.setdefault(model_id, []).append(replica)
        return where
