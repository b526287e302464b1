// The signer against seed 003 §4.4's golden vector, and its number printing against Python's
// own (`tests/sign_bodies.py --floats`: random bit patterns, decimal-looking values and ties).

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { test } from "node:test";

import { canonicalJson, pythonFloat, signedBody, tokenOf, type AuthContext } from "../src/signing.js";

const GOLDEN_SECRET = "test-hmac-secret-for-unit-tests-only";
const GOLDEN_TOKEN = "06af87716e9c3ba83441362dad2faa543c5db19d1c47fb937cd2ffe29cee1d21";

test("the seed's golden vector", () => {
  const body = {
    command: "echo hello",
    environment_id: "env_test123",
    auth_context: {
      user_id: "test_user",
      issued_at: 1716500000,
      nonce: "abc123def456",
      object_scope: { read: ["objects/in/data.csv"], write_prefixes: ["jobs/job_1/artifacts/"] },
    } as AuthContext,
  };
  assert.equal(
    canonicalJson(body),
    '{"auth_context":{"issued_at":1716500000,"nonce":"abc123def456","object_scope":{"read":["objects/in/data.csv"],' +
      '"write_prefixes":["jobs/job_1/artifacts/"]},"user_id":"test_user"},"command":"echo hello",' +
      '"environment_id":"env_test123"}',
  );
  assert.equal(tokenOf(GOLDEN_SECRET, "POST", "/tools/execute_command", body), GOLDEN_TOKEN);
  // Any changed byte changes the token.
  const changed = { ...body, command: "echo hellp" };
  assert.notEqual(tokenOf(GOLDEN_SECRET, "POST", "/tools/execute_command", changed), GOLDEN_TOKEN);
});

test("canonical JSON sorts keys by code point and escapes as Python does", () => {
  assert.equal(canonicalJson({ "\u{1F600}": 1, "\uFFFF": 2, a: [true, null, "é\n\u0001"] }), '{"a":[true,null,"é\\n\\u0001"],"\uFFFF":2,"\u{1F600}":1}');
  assert.throws(() => canonicalJson({ x: "\uD800" }), TypeError);
  assert.throws(() => canonicalJson({ x: Number.NaN }), TypeError);
  assert.equal(canonicalJson([1e21, 1e16, 0.5, -0.0001, 1e-5, 123.456]), "[1e+21,10000000000000000,0.5,-0.0001,1e-05,123.456]");
});

test("a signed body verifies under the same secret and carries a fresh nonce", () => {
  const a = signedBody("s3cret", "/tools/list_dir", { path: "/workspace" }, { user_id: "u1", thread_id: "t1" });
  const b = signedBody("s3cret", "/tools/list_dir", { path: "/workspace" }, { user_id: "u1", thread_id: "t1" });
  const ctx = a.auth_context as { [k: string]: unknown };
  assert.notEqual(ctx.nonce, (b.auth_context as { nonce: string }).nonce);
  const { token, ...rest } = ctx;
  const again = tokenOf("s3cret", "POST", "/tools/list_dir", { ...a, auth_context: rest as unknown as AuthContext });
  assert.equal(again, token);
});

test("doubles print as Python's json.dumps prints them", () => {
  const script = fileURLToPath(new URL("../../../../tests/sign_bodies.py", import.meta.url));
  const out = execFileSync("python3", [script, "--floats", "3000", "25"], { encoding: "utf8" });
  const view = new DataView(new ArrayBuffer(8));
  let compared = 0;
  let refused = 0;
  for (const line of out.trim().split("\n")) {
    const [bits, printed] = line.split(" ") as [string, string];
    view.setBigUint64(0, BigInt(`0x${bits}`));
    const x = view.getFloat64(0);
    if (Number.isFinite(x)) {
      assert.equal(pythonFloat(x), printed, bits);
      compared += 1;
    } else {
      // JSON cannot carry NaN or an infinity (Python prints a non-JSON token): never signed.
      assert.throws(() => pythonFloat(x), TypeError);
      refused += 1;
    }
  }
  assert.equal(compared + refused, 3000);
  assert.ok(compared >= 2900, `only ${compared} finite doubles compared`);
});
