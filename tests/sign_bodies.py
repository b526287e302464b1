#!/usr/bin/env python3
"""Generates signed /tools bodies exactly as the gateway of seed 003 §4.3 does, for the differential
test of tests/tools_signing.rs.

Usage: sign_bodies.py SECRET COUNT SEED [--path P] [--thread T] [--http]
       sign_bodies.py --floats COUNT SEED

Prints one JSON record per line:
  {"path": P, "body": <the body as sent, text>, "mutated": <the body with one value changed, same token>}
With --floats it prints COUNT lines "<64-bit pattern in hex> <json.dumps of that double>" instead
(random bit patterns, decimal-looking values and ties), for the float printing test.
With --http the generated parameters stay within what a real route accepts (no NaN/Infinity, a
"path" of "/workspace"), and auth_context carries thread_id T.
"""

import hashlib
import hmac
import json
import random
import sys
import time
from typing import Any


# --- seed 003 §4.3, verbatim in substance ---------------------------------------------------------

def canonical_json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def payload_hash(body_without_token: dict) -> str:
    data = canonical_json(body_without_token).encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def canonical_string(method: str, path: str, issued_at: int, nonce: str, body_hash: str) -> str:
    return "\n".join([method.upper(), path, str(issued_at), nonce, body_hash])


def sign(secret: str, canonical: str) -> str:
    return hmac.new(secret.encode("utf-8"), canonical.encode("utf-8"), hashlib.sha256).hexdigest()


def build_body(secret, method, path, body_params, *, user_id, thread_id, object_scope, nonce):
    issued_at = int(time.time())
    auth_context = {"user_id": user_id, "thread_id": thread_id, "issued_at": issued_at, "nonce": nonce}
    if object_scope:
        auth_context["object_scope"] = object_scope
    body_without_token = {"auth_context": auth_context, **body_params}
    digest = payload_hash(body_without_token)
    canonical = canonical_string(method, path, issued_at, nonce, digest)
    auth_context["token"] = sign(secret, canonical)
    return {"auth_context": auth_context, **body_params}


# --- generated content ----------------------------------------------------------------------------

CHAR_POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-./:",
    '"\\/\'{}[],:',
    "".join(chr(c) for c in range(0x00, 0x20)) + "\x7f",
    "éüßøñçÅΩЖж中文字日本語한국어",
    "e\u0301a\u0300o\u0308\u0327\u20dd",  # combining marks
    "\U0001F600\U0001F680\U00010348\U0001D11E\U0010FFFD",  # astral
    "\u2028\u2029\ufeff\u200b\u00a0\u00ad\ufffd",
]


def rand_string(r: random.Random, max_len=24) -> str:
    n = r.randint(0, max_len)
    return "".join(r.choice(r.choice(CHAR_POOLS)) for _ in range(n))


def rand_int(r: random.Random) -> int:
    kind = r.randrange(6)
    if kind == 0:
        return r.randint(-10, 10)
    if kind == 1:
        return r.randint(-(2**31), 2**31)
    if kind == 2:
        return r.choice([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**64) - 1])
    if kind == 3:
        return r.getrandbits(r.randint(65, 300)) * r.choice([1, -1])
    if kind == 4:
        return int(time.time())
    return r.randint(0, 10**18)


FIXED_FLOATS = [0.1, 0.2, 0.3, 1e-7, 1e-5, 1e-4, 0.0001234, 1e16, 1e15, 9999999999999998.0, 1e22, 1e-300,
                5e-324, 1.7976931348623157e308, -0.0, 0.0, 1.0, 100000.0, 123.456, -2.5, 1 / 3, 2 / 3,
                float(2**53), float(2**53 + 1), 1e100, 1.5e-10, 4.35, 0.5, 1e21, 12345678901234567.0]


def rand_float(r: random.Random, http: bool) -> float:
    kind = r.randrange(5)
    if kind == 0:
        return r.choice(FIXED_FLOATS)
    if kind == 1:
        return r.random() * 10 ** r.randint(-30, 30) * r.choice([1, -1])
    if kind == 2:
        return r.uniform(-1e6, 1e6)
    if kind == 3:
        # Any finite double, from random bits.
        import struct
        while True:
            f = struct.unpack("<d", r.getrandbits(64).to_bytes(8, "little"))[0]
            if f == f and f not in (float("inf"), float("-inf")):
                return f
    if http:
        return r.choice(FIXED_FLOATS)
    return r.choice([float("inf"), float("-inf"), float("nan"), 1e308 * 10])


def rand_value(r: random.Random, depth: int, http: bool) -> Any:
    kinds = ["str", "int", "float", "bool", "null"]
    if depth < 4:
        kinds += ["obj", "arr", "obj", "arr"]
    kind = r.choice(kinds)
    if kind == "str":
        return rand_string(r)
    if kind == "int":
        return rand_int(r)
    if kind == "float":
        return rand_float(r, http)
    if kind == "bool":
        return r.choice([True, False])
    if kind == "null":
        return None
    if kind == "arr":
        return [rand_value(r, depth + 1, http) for _ in range(r.randint(0, 5))]
    return {rand_string(r, 10): rand_value(r, depth + 1, http) for _ in range(r.randint(0, 5))}


def mutate(r: random.Random, value: Any) -> Any:
    """The same structure with exactly one leaf changed (by one character, digit or flag)."""
    leaves = []

    def collect(v, parent, key):
        if isinstance(v, dict):
            for k in v:
                collect(v[k], v, k)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                collect(x, v, i)
        else:
            leaves.append((parent, key))

    copy = json.loads(json.dumps(value))
    collect(copy, None, None)
    leaves = [(p, k) for (p, k) in leaves if not (isinstance(p, dict) and k == "token")]
    parent, key = r.choice(leaves)
    old = parent[key]
    if isinstance(old, bool):
        new = not old
    elif old is None:
        new = 0
    elif isinstance(old, int):
        new = old + r.choice([1, -1])
    elif isinstance(old, float):
        new = old + 1.0 if old == old and abs(old) < 1e15 else 0.5
    else:
        s = list(old)
        if s:
            i = r.randrange(len(s))
            s[i] = chr(ord(s[i]) ^ 1)
            new = "".join(s)
        else:
            new = "x"
    parent[key] = new
    return copy


def wire(r: random.Random, body: dict) -> str:
    """The body as a client could send it: any key order, spacing and ASCII escaping."""
    def shuffle(v):
        if isinstance(v, dict):
            items = list(v.items())
            r.shuffle(items)
            return {k: shuffle(x) for k, x in items}
        if isinstance(v, list):
            return [shuffle(x) for x in v]
        return v

    seps = r.choice([(",", ":"), (", ", ": "), (" ,", " : ")])
    return json.dumps(shuffle(body), ensure_ascii=r.choice([True, False]), separators=seps,
                      indent=r.choice([None, None, 2]))


def floats(count: int, seed: int) -> None:
    import struct
    r = random.Random(seed)
    for i in range(count):
        kind = i % 4
        if kind == 0:
            bits = r.getrandbits(64)
        else:
            if kind == 1:
                f = float("%d.%de%d" % (r.randint(0, 10**r.randint(1, 17)), r.randint(0, 999), r.randint(-330, 310)))
            elif kind == 2:
                f = r.randint(1, 2**53) / 2 ** r.randint(0, 60)
            else:
                f = r.uniform(-1e17, 1e17)
            bits = struct.unpack("<Q", struct.pack("<d", f))[0]
        f = struct.unpack("<d", struct.pack("<Q", bits))[0]
        sys.stdout.write("%016x %s\n" % (bits, json.dumps(f)))


def main() -> None:
    args = sys.argv[1:]
    if args[0] == "--floats":
        floats(int(args[1]), int(args[2]))
        return
    secret, count, seed = args[0], int(args[1]), int(args[2])
    path = args[args.index("--path") + 1] if "--path" in args else "/tools/execute_command"
    thread = args[args.index("--thread") + 1] if "--thread" in args else "thr_differential"
    http = "--http" in args
    r = random.Random(seed)
    out = sys.stdout
    for i in range(count):
        params = {rand_string(r, 12): rand_value(r, 0, http) for _ in range(r.randint(0, 6))}
        params.pop("auth_context", None)
        object_scope = None
        if http:
            # A route answers an unknown parameter with 400 and object_scope bounds the paths a
            # request may read: the generated content travels inside object_scope, under keys that
            # grant nothing, next to a grant of the whole workspace.
            object_scope = {"read": ["/workspace"], "write_prefixes": [rand_string(r)], "n": params}
            params = {"path": "/workspace"}
        else:
            params["command"] = rand_string(r, 40)
            if r.random() < 0.5:
                object_scope = {"read": [rand_string(r)], "write_prefixes": [rand_string(r)], "n": rand_value(r, 2, http)}
        nonce = "%032x" % r.getrandbits(128)
        # Through a real route one thread belongs to one user (a scope's first user; issue 12).
        user_id = "u_http" if http else "u_" + str(i)
        body = build_body(secret, "POST", path, params, user_id=user_id, thread_id=thread,
                          object_scope=object_scope, nonce=nonce)
        mutated = mutate(r, body)
        record = {"path": path, "body": wire(r, body), "mutated": wire(r, mutated)}
        out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
