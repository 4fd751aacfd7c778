"""A realistic web clickstream: users, sessions, pages, referrers, devices.

Deterministic for a seed, so the demo and the benchmark are repeatable. Users
have sessions of several page views a few seconds apart; page popularity is
Zipf-like, as real traffic is.
"""

from __future__ import annotations

import random
from typing import Iterator

PAGES = [
    "/", "/search", "/cart", "/checkout", "/login", "/signup", "/help",
    "/account", "/orders", "/deals", "/blog", "/about",
] + [f"/product/{i}" for i in range(1, 41)] + [f"/category/{c}" for c in (
    "books", "music", "garden", "kitchen", "toys", "sports", "tools", "games")]
REFERRERS = ["direct", "search", "social", "email", "ads", "partner"]
DEVICES = ["desktop", "mobile", "tablet"]
COUNTRIES = ["DE", "FR", "US", "GB", "BR", "IN", "JP", "ES", "IT", "NL"]


def events(count: int, seed: int = 7, start_ms: int = 1_767_225_600_000,
           users: int = 5_000) -> Iterator[dict]:
    """``count`` page-view events in time order, starting at ``start_ms``."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) ** 1.1 for rank in range(len(PAGES))]
    now_ms = start_ms
    open_sessions: dict[int, tuple[str, int]] = {}
    for n in range(count):
        now_ms += rng.randint(0, 40)
        user = rng.randrange(users)
        session = open_sessions.get(user)
        if session is None or rng.random() < 0.12:
            session = (f"s{user:05d}-{n:07d}", 0)
        sid, views = session
        open_sessions[user] = (sid, views + 1)
        yield {
            "ts": now_ms,
            "user": f"u{user:05d}",
            "session": sid,
            "page": rng.choices(PAGES, weights)[0],
            "referrer": REFERRERS[rng.randrange(len(REFERRERS))] if views == 0 else "internal",
            "device": DEVICES[min(int(rng.expovariate(1.5)), 2)],
            "country": COUNTRIES[rng.randrange(len(COUNTRIES))],
            "duration_ms": int(rng.lognormvariate(8.5, 0.9)),
        }


def padded_record(rng: random.Random, size: int = 1024) -> bytes:
    """One JSON clickstream event padded with a realistic user-agent/URL blob
    to exactly ``size`` bytes (for the benchmark's 1 KiB records)."""
    import orjson

    event = next(events(1, seed=rng.randrange(1 << 30)))
    event["ua"] = ""
    base = orjson.dumps(event)
    filler = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    need = size - len(base)
    assert need >= 0
    event["ua"] = (filler * (need // len(filler) + 1))[:need]
    out = orjson.dumps(event)
    assert len(out) == size
    return out
