// The signer of seed 003 §4.3 for `/tools/*` bodies: the canonical JSON of the body without its
// token (Python's `json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":"))` of
// the body as the daemon parses the text sent), its SHA-256, the canonical string
// `METHOD\nPATH\nissued_at\nnonce\nhash` and its HMAC-SHA256 under the shared secret.

import { createHash, createHmac, randomUUID } from "node:crypto";

/** A JSON value a signed body may hold. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** `auth_context` without its token. */
export interface AuthContext {
  user_id: string;
  thread_id?: string;
  issued_at: number;
  nonce: string;
  object_scope?: { read?: string[]; write_prefixes?: string[] };
  [key: string]: Json | undefined;
}

function hasLoneSurrogate(s: string): boolean {
  return /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s);
}

/** Python's `repr` of a double (shortest round-trip digits; scientific below 1e-4 and from 1e16,
 * with at least two exponent digits; a `.0` on whole numbers). */
export function pythonFloat(n: number): string {
  if (!Number.isFinite(n)) throw new TypeError("NaN and infinities cannot be signed");
  if (n === 0) return Object.is(n, -0) ? "-0.0" : "0.0";
  const [mantissa, exp] = n.toExponential().split("e") as [string, string];
  const e = Number(exp);
  const negative = mantissa.startsWith("-");
  const digits = mantissa.replace("-", "").replace(".", "");
  const sign = negative ? "-" : "";
  if (e < -4 || e >= 16) {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    const x = Math.abs(e).toString().padStart(2, "0");
    return `${sign}${m}e${e < 0 ? "-" : "+"}${x}`;
  }
  if (e < 0) return `${sign}0.${"0".repeat(-e - 1)}${digits}`;
  const whole = digits.slice(0, e + 1).padEnd(e + 1, "0");
  const frac = digits.slice(e + 1);
  return `${sign}${whole}.${frac || "0"}`;
}

/** A number as the daemon canonicalizes the text `JSON.stringify` sends for it: an integer form
 * stays an integer, any other is a double printed as Python prints it. */
function canonicalNumber(n: number): string {
  if (!Number.isFinite(n)) throw new TypeError("NaN and infinities cannot be signed");
  const sent = JSON.stringify(n);
  return /^-?\d+$/.test(sent) ? sent : pythonFloat(n);
}

/** Compares strings by Unicode code point (Python's order), not by UTF-16 unit. */
function byCodePoint(a: string, b: string): number {
  const ia = a[Symbol.iterator]();
  const ib = b[Symbol.iterator]();
  for (;;) {
    const x = ia.next();
    const y = ib.next();
    if (x.done || y.done) return x.done === y.done ? 0 : x.done ? -1 : 1;
    const d = (x.value.codePointAt(0) as number) - (y.value.codePointAt(0) as number);
    if (d !== 0) return d;
  }
}

/** The canonical JSON of seed 003 §4.3 of a JSON value (object members that are `undefined` are
 * left out, as `JSON.stringify` leaves them out of the text sent); anything else JSON cannot
 * carry as it is (NaN, a lone surrogate, a function, a bigint, ...) is refused. */
export function canonicalJson(v: unknown): string {
  if (v === null || typeof v === "boolean") return String(v);
  if (typeof v === "number") return canonicalNumber(v);
  if (typeof v === "string") {
    if (hasLoneSurrogate(v)) throw new TypeError("a string with a lone surrogate cannot be signed");
    return JSON.stringify(v);
  }
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(",")}]`;
  if (typeof v !== "object" || Object.getPrototypeOf(v) !== Object.prototype) {
    throw new TypeError(`a ${typeof v} cannot be signed`);
  }
  const o = v as Record<string, unknown>;
  const keys = Object.keys(o)
    .filter((k) => o[k] !== undefined)
    .sort(byCodePoint);
  return `{${keys.map((k) => `${canonicalJson(k)}:${canonicalJson(o[k])}`).join(",")}}`;
}

/** The token of a body (`auth_context` without `token`, the tool's parameters beside it). */
export function tokenOf(secret: string, method: string, path: string, bodyWithoutToken: { auth_context: AuthContext }): string {
  const digest = createHash("sha256").update(canonicalJson(bodyWithoutToken), "utf8").digest("hex");
  const ctx = bodyWithoutToken.auth_context;
  const canonical = [method.toUpperCase(), path, String(ctx.issued_at), ctx.nonce, digest].join("\n");
  return createHmac("sha256", secret).update(canonical, "utf8").digest("hex");
}

/** A signed body for `POST path` as `user_id` (of `thread_id`), with a fresh nonce and the time
 * now (every attempt of a call must be signed again). */
export function signedBody(
  secret: string,
  path: string,
  params: { [key: string]: Json },
  who: { user_id: string; thread_id?: string; object_scope?: AuthContext["object_scope"] },
): { [key: string]: Json } {
  const auth_context: AuthContext = {
    ...who,
    issued_at: Math.floor(Date.now() / 1000),
    nonce: randomUUID().replaceAll("-", ""),
  };
  const body = { ...params, auth_context };
  const token = tokenOf(secret, "POST", path, body);
  return { ...params, auth_context: { ...(auth_context as { [key: string]: Json }), token } };
}
