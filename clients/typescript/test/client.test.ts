// The WebUI client against a live daemon (started by tests/clients_typescript.rs, which passes its
// address and service token in SCOPEFS_URL and SCOPEFS_SERVICE_TOKEN).

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { ScopefsClient, ScopefsError, ScopefsUnreachable, signedBody } from "../src/index.js";

function env(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run this suite through tests/clients_typescript.rs`);
  return v;
}

const client = new ScopefsClient({ baseUrl: env("SCOPEFS_URL"), serviceToken: env("SCOPEFS_SERVICE_TOKEN") });

/** A thread id unique to one test. */
function thread(): string {
  return `ts-${randomUUID()}`;
}

async function provisioned(): Promise<{ threadId: string; scopeId: string }> {
  const threadId = thread();
  const scope = (await client.provision({ operation_id: `op-${threadId}`, primary_thread_id: threadId })) as {
    scope_id: string;
    state: string;
  };
  assert.equal(scope.state, "draft");
  return { threadId, scopeId: scope.scope_id };
}

async function bytesOf(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  for await (const c of stream) chunks.push(c);
  return Buffer.concat(chunks);
}

/** `n` bytes of a repeating pattern, produced in 64 KiB chunks as a stream. */
function patterned(n: number): ReadableStream<Uint8Array> {
  let sent = 0;
  return new ReadableStream<Uint8Array>({
    pull(controller) {
      if (sent >= n) return controller.close();
      const len = Math.min(64 * 1024, n - sent);
      const chunk = new Uint8Array(len);
      for (let i = 0; i < len; i++) chunk[i] = (sent + i) % 251;
      sent += len;
      controller.enqueue(chunk);
    },
  });
}

test("provision is idempotent on operation_id and the scope is found by its thread", async () => {
  const { threadId, scopeId } = await provisioned();
  const again = (await client.provision({ operation_id: `op-${threadId}`, primary_thread_id: threadId })) as {
    scope_id: string;
    created: boolean;
  };
  assert.equal(again.scope_id, scopeId);
  assert.equal(again.created, false);
  const found = (await client.scopeByThread(threadId)) as { scope_id: string; state: string };
  assert.deepEqual([found.scope_id, found.state], [scopeId, "draft"]);
});

test("streamed upload, listing, ranged read, streamed write, zip and delete", async () => {
  const { threadId } = await provisioned();
  const big = 3 * 1024 * 1024 + 17;
  const up = (await client.upload(
    threadId,
    [
      { name: "big.bin", content: patterned(big) },
      { name: "notes/hello.txt", content: "hello from typescript\n" },
    ],
    { dir: "data" },
  )) as { files: { virtual_path: string; size: number }[] };
  assert.deepEqual(
    up.files.map((f) => [f.virtual_path, f.size]),
    [
      ["/data/big.bin", big],
      ["/data/notes/hello.txt", 22],
    ],
  );

  const listed = (await client.list(threadId, { path: "data", recursive: true })) as {
    entries: { path: string; type: string }[];
  };
  assert.deepEqual(
    listed.entries.map((e) => [e.path, e.type]).sort(),
    [
      ["data/big.bin", "file"],
      ["data/notes", "directory"],
      ["data/notes/hello.txt", "file"],
    ],
  );

  const part = await client.readFile(threadId, "data/big.bin", { range: [1000, 1009] });
  assert.equal(part.status, 206);
  assert.deepEqual([...(await bytesOf(part.body))], Array.from({ length: 10 }, (_, i) => (1000 + i) % 251));
  const whole = await bytesOf((await client.readFile(threadId, "/data/big.bin")).body);
  assert.equal(whole.length, big);
  assert.equal(whole[big - 1], (big - 1) % 251);

  async function* lines() {
    for (let i = 0; i < 1000; i++) yield new TextEncoder().encode(`line ${i}\n`);
  }
  const written = (await client.writeFile(threadId, "out/log.txt", lines())) as { virtual_path: string; size: number };
  assert.equal(written.virtual_path, "/out/log.txt");
  const text = await client.readText(threadId, "out/log.txt");
  assert.equal(text.split("\n").length, 1001);
  assert.equal(written.size, Buffer.byteLength(text));

  const zip = await bytesOf(await client.downloadZip(threadId));
  assert.deepEqual([...zip.subarray(0, 4)], [0x50, 0x4b, 0x03, 0x04], "a zip's first local header");
  const names = Buffer.from(zip).toString("latin1");
  for (const n of ["data/big.bin", "data/notes/hello.txt", "out/log.txt"]) assert.ok(names.includes(n), n);

  const usage = (await client.usage(threadId)) as { files: number; bytes: number };
  assert.equal(usage.files, 3);
  assert.equal(usage.bytes, big + 22 + Buffer.byteLength(text));

  await client.deleteFile(threadId, "data", { recursive: true });
  await assert.rejects(client.readText(threadId, "data/notes/hello.txt"), (e: unknown) => {
    assert.ok(e instanceof ScopefsError);
    assert.equal(e.status, 404);
    assert.equal(e.code, "not_found");
    return true;
  });
});

test("errors carry the API's status and code", async () => {
  const { threadId } = await provisioned();
  await client.upload(threadId, [{ name: "a.txt", content: "one" }]);
  await assert.rejects(client.upload(threadId, [{ name: "a.txt", content: "two" }]), (e: unknown) => {
    assert.ok(e instanceof ScopefsError);
    assert.deepEqual([e.status, e.code], [409, "file_exists"]);
    return true;
  });
  await client.upload(threadId, [{ name: "a.txt", content: "two" }], { overwrite: true });
  assert.equal(await client.readText(threadId, "a.txt"), "two");

  const stranger = new ScopefsClient({ baseUrl: env("SCOPEFS_URL"), serviceToken: "not-the-token" });
  await assert.rejects(stranger.scopeByThread(threadId), (e: unknown) => {
    assert.ok(e instanceof ScopefsError);
    assert.equal(e.status, 401);
    return true;
  });
  await assert.rejects(client.scopeByThread(thread()), (e: unknown) => {
    assert.ok(e instanceof ScopefsError);
    assert.deepEqual([e.status, e.code], [404, "scope_not_found"]);
    return true;
  });
  // A name that would break a multipart header is refused before anything is sent.
  await assert.rejects(client.upload(threadId, [{ name: 'quote".txt', content: "x" }]), TypeError);
  const nowhere = new ScopefsClient({ baseUrl: "http://127.0.0.1:9", serviceToken: "x" });
  await assert.rejects(nowhere.usage(threadId), ScopefsUnreachable);
});

test("a run reservation is idempotent and activates the draft; a snapshot is listed and read", async () => {
  const { threadId, scopeId } = await provisioned();
  const body = { run_request_id: `run-${threadId}`, turn_id: "turn-1", request_hash: "sha256:first" };
  const first = (await client.reserveRun(scopeId, body)) as { created: boolean; scope_state: string };
  const second = (await client.reserveRun(scopeId, body)) as { created: boolean };
  assert.deepEqual([first.created, first.scope_state, second.created], [true, "active", false]);

  await client.writeFile(threadId, "kept.txt", "before");
  const snapshotId = `s-${threadId}`;
  await client.createSnapshot(scopeId, { snapshot_id: snapshotId });
  await client.writeFile(threadId, "kept.txt", "after");
  const snaps = (await client.listSnapshots(scopeId)) as { snapshots: { snapshot_id: string }[] };
  assert.deepEqual(
    snaps.snapshots.map((s) => s.snapshot_id),
    [snapshotId],
  );
  const old = await bytesOf((await client.readFile(threadId, "kept.txt", { snapshotId })).body);
  assert.equal(Buffer.from(old).toString(), "before");
  assert.equal(await client.readText(threadId, "kept.txt"), "after");
});

test("a body signed by this package's signer is accepted by the daemon; a changed one is refused", async () => {
  const { threadId } = await provisioned();
  const secret = env("SCOPEFS_HMAC_SECRET");
  const who = { user_id: "ts-user", thread_id: threadId };
  const post = (body: unknown) =>
    fetch(`${env("SCOPEFS_URL")}/tools/list_dir`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
  const ok = await post(signedBody(secret, "/tools/list_dir", { path: "/workspace" }, who));
  assert.equal(ok.status, 200, await ok.clone().text());
  const changed = signedBody(secret, "/tools/list_dir", { path: "/workspace" }, who);
  changed.path = "/workspace/.";
  const refused = await post(changed);
  assert.equal(refused.status, 401);
});
