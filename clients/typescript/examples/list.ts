// Lists a thread's workspace through the client (the README's quickstart, step 4):
//   node dist/examples/list.js [THREAD_ID] [PATH]
// The daemon's address is SCOPEFS_URL (default http://127.0.0.1:7070); its service token
// SCOPEFS_SERVICE_TOKEN, else the file the daemon generated (SCOPEFS_DATA_DIR, default
// /var/lib/scopefs, control/service-token; readable by root).

import { readFileSync } from "node:fs";
import { join } from "node:path";

import { ScopefsClient, ScopefsError } from "../src/index.js";

const [threadId = "quickstart", path] = process.argv.slice(2);
const token =
  process.env.SCOPEFS_SERVICE_TOKEN ??
  readFileSync(join(process.env.SCOPEFS_DATA_DIR ?? "/var/lib/scopefs", "control", "service-token"), "utf8").trim();
const client = new ScopefsClient({ baseUrl: process.env.SCOPEFS_URL ?? "http://127.0.0.1:7070", serviceToken: token });
let listing: { entries: { virtual_path: string; type: string; size: number }[] };
try {
  listing = (await client.list(threadId, { path, recursive: true })) as typeof listing;
} catch (e) {
  console.error(e instanceof ScopefsError ? `scopefs answered ${e.message}` : String(e));
  process.exit(1);
}
console.log(`thread ${threadId}, listed through the TypeScript client:`);
for (const e of listing.entries) {
  console.log(`${e.type === "directory" ? "d" : "-"} ${String(e.size).padStart(12)} ${e.virtual_path}`);
}
