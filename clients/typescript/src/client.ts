// The client of a WebUI server: the scope routes (`/internal/workspace-scopes/*`, leases) and the
// workspace file routes (`/api/workspace*`), over `fetch`, with the service token as a bearer.
// Bodies stream both ways: uploads and writes are sent as they are produced, reads and the zip
// come back as streams.

import { errorOf, ScopefsError, ScopefsUnreachable } from "./errors.js";
import { multipartBody, streamOf, type Content, type Part } from "./multipart.js";
import type { Answer, Method, Path, RequestBody } from "./types.js";

export interface ClientOptions {
  /** The daemon's base URL, e.g. `http://127.0.0.1:7070`. */
  baseUrl: string;
  /** The service token (`/internal/*`, `/api/*`). */
  serviceToken: string;
  /** A `fetch` to use instead of the global one (tests, proxies). */
  fetch?: typeof fetch;
}

/** A file to upload: its name (may contain sub-directories) and content. */
export interface UploadFile {
  name: string;
  content: Content;
}

type Query = Record<string, string | number | boolean | undefined>;

function enc(segment: string): string {
  return encodeURIComponent(segment);
}

export class ScopefsClient {
  private readonly base: string;
  private readonly token: string;
  private readonly fetcher: typeof fetch;

  constructor(options: ClientOptions) {
    this.base = options.baseUrl.replace(/\/+$/, "");
    this.token = options.serviceToken;
    this.fetcher = options.fetch ?? globalThis.fetch;
  }

  /** One request; a non-2xx answer throws `ScopefsError`, no answer at all `ScopefsUnreachable`. */
  async request(method: string, path: string, init: { query?: Query; body?: BodyInit; headers?: HeadersInit } = {}) {
    const url = new URL(this.base + path);
    for (const [k, v] of Object.entries(init.query ?? {})) {
      if (v !== undefined) url.searchParams.set(k, String(v));
    }
    const headers = new Headers(init.headers);
    headers.set("authorization", `Bearer ${this.token}`);
    const streamed = init.body instanceof ReadableStream;
    let resp: Response;
    try {
      resp = await this.fetcher(url, {
        method,
        headers,
        body: init.body,
        // A streamed body is sent while it is produced (required by Node's fetch for streams).
        ...(streamed ? { duplex: "half" } : {}),
      } as RequestInit);
    } catch (e) {
      throw new ScopefsUnreachable(e);
    }
    if (!resp.ok) throw await errorOf(resp);
    return resp;
  }

  private async json<P extends Path, M extends Method>(
    method: M,
    route: P,
    path: string,
    body?: RequestBody<P, M>,
    query?: Query,
  ): Promise<Answer<P, M>> {
    const init: { query?: Query; body?: BodyInit; headers?: HeadersInit } = { query };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers = { "content-type": "application/json" };
    }
    const resp = await this.request(method.toUpperCase(), path, init);
    return (await resp.json()) as Answer<P, M>;
  }

  // --- scopes (/internal/workspace-scopes/*) -----------------------------------------------------

  /** Creates (or returns) the draft scope of a primary thread; idempotent on `operation_id`. */
  provision(body: RequestBody<"/internal/workspace-scopes/provision", "post">) {
    return this.json("post", "/internal/workspace-scopes/provision", "/internal/workspace-scopes/provision", body);
  }

  /** The scope of a primary thread (404 `scope_not_found`). */
  scopeByThread(threadId: string) {
    const route = "/internal/workspace-scopes/by-thread/{thread_id}" as const;
    return this.json("get", route, `/internal/workspace-scopes/by-thread/${enc(threadId)}`);
  }

  /** Revision compare-and-set of a scope's state (`active`, `deleting`). */
  patchScope(scopeId: string, body: RequestBody<"/internal/workspace-scopes/{scope_id}", "patch">) {
    return this.json("patch", "/internal/workspace-scopes/{scope_id}", `/internal/workspace-scopes/${enc(scopeId)}`, body);
  }

  /** The host view and container bind source of a scope (mounts it if needed). */
  mount(scopeId: string) {
    const route = "/internal/workspace-scopes/{scope_id}/mount" as const;
    return this.json("get", route, `/internal/workspace-scopes/${enc(scopeId)}/mount`);
  }

  /** Idempotent run reservation (`run_request_id`); activates a draft scope. */
  reserveRun(scopeId: string, body: RequestBody<"/internal/workspace-scopes/{scope_id}/runs/reserve", "post">) {
    const route = "/internal/workspace-scopes/{scope_id}/runs/reserve" as const;
    return this.json("post", route, `/internal/workspace-scopes/${enc(scopeId)}/runs/reserve`, body);
  }

  /** Attaches a run id and/or changes a run request's state. */
  updateRun(
    scopeId: string,
    runRequestId: string,
    body: RequestBody<"/internal/workspace-scopes/{scope_id}/runs/{run_request_id}", "patch">,
  ) {
    const route = "/internal/workspace-scopes/{scope_id}/runs/{run_request_id}" as const;
    return this.json("patch", route, `/internal/workspace-scopes/${enc(scopeId)}/runs/${enc(runRequestId)}`, body);
  }

  /** Records a read-only point in time of a scope. */
  createSnapshot(scopeId: string, body: RequestBody<"/internal/workspace-scopes/{scope_id}/snapshots", "post">) {
    const route = "/internal/workspace-scopes/{scope_id}/snapshots" as const;
    return this.json("post", route, `/internal/workspace-scopes/${enc(scopeId)}/snapshots`, body);
  }

  /** The snapshots of a scope. */
  listSnapshots(scopeId: string) {
    const route = "/internal/workspace-scopes/{scope_id}/snapshots" as const;
    return this.json("get", route, `/internal/workspace-scopes/${enc(scopeId)}/snapshots`);
  }

  /** A new scope (a conversation branch) whose files are this one's now. */
  fork(scopeId: string, body: RequestBody<"/internal/workspace-scopes/{scope_id}/fork", "post">) {
    const route = "/internal/workspace-scopes/{scope_id}/fork" as const;
    return this.json("post", route, `/internal/workspace-scopes/${enc(scopeId)}/fork`, body);
  }

  // --- workspace files (/api/workspace*) ---------------------------------------------------------

  /** Lists a directory of the thread's workspace (or of one of its snapshots). */
  list(threadId: string, options: { path?: string; recursive?: boolean; snapshotId?: string } = {}) {
    const query = { threadId, path: options.path, recursive: options.recursive ? 1 : undefined, snapshotId: options.snapshotId };
    return this.json("get", "/api/workspace", "/api/workspace", undefined, query);
  }

  /** Uploads files (streamed, one after another) into `dir`; `overwrite` replaces existing ones
   * (otherwise an existing name is 409 `file_exists`). */
  async upload(threadId: string, files: UploadFile[], options: { dir?: string; overwrite?: boolean } = {}) {
    const parts: Part[] = [];
    if (options.dir !== undefined) parts.push({ kind: "field", name: "dir", value: options.dir });
    for (const f of files) parts.push({ kind: "file", name: f.name, content: f.content });
    const { body, contentType } = multipartBody(parts);
    const query = { threadId, overwrite: options.overwrite ? 1 : undefined };
    const resp = await this.request("POST", "/api/workspace/upload", { query, body, headers: { "content-type": contentType } });
    return (await resp.json()) as Answer<"/api/workspace/upload", "post">;
  }

  /** A file's content as a stream; `range` as `[start, endInclusive]` asks for part of it. */
  async readFile(threadId: string, path: string, options: { range?: [number, number]; snapshotId?: string } = {}) {
    const headers: Record<string, string> = {};
    if (options.range) headers.range = `bytes=${options.range[0]}-${options.range[1]}`;
    const resp = await this.request("GET", "/api/workspace/file", {
      query: { threadId, path, snapshotId: options.snapshotId },
      headers,
    });
    return { status: resp.status, headers: resp.headers, body: resp.body ?? new ReadableStream<Uint8Array>() };
  }

  /** A file's whole content as text (UTF-8). */
  async readText(threadId: string, path: string): Promise<string> {
    const resp = await this.request("GET", "/api/workspace/file", { query: { threadId, path } });
    return resp.text();
  }

  /** Writes `content` (streamed) as the file's new version: an atomic replace that creates the
   * file and its missing parents. */
  async writeFile(threadId: string, path: string, content: Content) {
    const resp = await this.request("PUT", "/api/workspace/file", { query: { threadId, path }, body: streamOf(content) });
    return (await resp.json()) as Answer<"/api/workspace/file", "put">;
  }

  /** Deletes a file (`recursive` for a directory and what it holds). */
  async deleteFile(threadId: string, path: string, options: { recursive?: boolean } = {}): Promise<void> {
    const query = { threadId, path, recursive: options.recursive ? 1 : undefined };
    const resp = await this.request("DELETE", "/api/workspace/file", { query });
    await resp.body?.cancel();
  }

  /** The workspace's files as a zip, streamed while the daemon writes it. */
  async downloadZip(threadId: string, options: { snapshotId?: string } = {}): Promise<ReadableStream<Uint8Array>> {
    const resp = await this.request("GET", "/api/workspace/download", { query: { threadId, snapshotId: options.snapshotId } });
    return resp.body ?? new ReadableStream<Uint8Array>();
  }

  /** File count, bytes and quota of the workspace. */
  usage(threadId: string) {
    return this.json("get", "/api/workspace/usage", "/api/workspace/usage", undefined, { threadId });
  }
}

export { ScopefsError, ScopefsUnreachable };
