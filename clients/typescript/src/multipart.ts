// A streamed multipart/form-data body for `POST /api/workspace/upload`: parts are produced one
// after another as the request is sent, so a file of any size is never held in memory whole.

/** What a file part's content may be. */
export type Content = Uint8Array | string | Blob | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

/** One part of an upload: a file (its name may contain sub-directories) or the `dir` text field. */
export type Part = { kind: "file"; name: string; content: Content } | { kind: "field"; name: string; value: string };

const encoder = new TextEncoder();

/** A quoted header parameter; refuses characters that would break the header (`"`, `\`, CR, LF). */
function quoted(value: string): string {
  if (/["\\\r\n]/.test(value)) {
    throw new TypeError('a multipart name may not contain ", \\, CR or LF');
  }
  return `"${value}"`;
}

async function* chunksOf(content: Content): AsyncGenerator<Uint8Array> {
  if (typeof content === "string") {
    yield encoder.encode(content);
  } else if (content instanceof Uint8Array) {
    yield content;
  } else if (content instanceof Blob) {
    yield* chunksOf(content.stream());
  } else if (content instanceof ReadableStream) {
    const reader = content.getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return;
        yield value;
      }
    } finally {
      reader.releaseLock();
    }
  } else {
    yield* content;
  }
}

/** The body and its content type (with a fresh random boundary). */
export function multipartBody(parts: Part[]): { body: ReadableStream<Uint8Array>; contentType: string } {
  const boundary = `scopefs-${crypto.randomUUID()}`;
  // Checked before anything is sent, so a bad name fails the call, not the stream.
  const heads = parts.map((p) => {
    const disposition =
      p.kind === "file"
        ? `form-data; name="file"; filename=${quoted(p.name)}`
        : `form-data; name=${quoted(p.name)}`;
    const type = p.kind === "file" ? "Content-Type: application/octet-stream\r\n" : "";
    return encoder.encode(`--${boundary}\r\nContent-Disposition: ${disposition}\r\n${type}\r\n`);
  });
  async function* produce(): AsyncGenerator<Uint8Array> {
    for (const [i, p] of parts.entries()) {
      yield heads[i] as Uint8Array;
      if (p.kind === "file") {
        yield* chunksOf(p.content);
      } else {
        yield encoder.encode(p.value);
      }
      yield encoder.encode("\r\n");
    }
    yield encoder.encode(`--${boundary}--\r\n`);
  }
  const it = produce();
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { done, value } = await it.next();
      if (done) controller.close();
      else controller.enqueue(value);
    },
    async cancel() {
      await it.return(undefined);
    },
  });
  return { body, contentType: `multipart/form-data; boundary=${boundary}` };
}

/** A body for `fetch` that streams `content` (strings and byte arrays are sent as they are). */
export function streamOf(content: Content): BodyInit {
  if (typeof content === "string" || content instanceof Blob) return content;
  // A byte array is a valid body; TypeScript's DOM types only lack the `ArrayBufferLike` form.
  if (content instanceof Uint8Array) return content as Uint8Array<ArrayBuffer>;
  if (content instanceof ReadableStream) return content;
  const it = content[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { done, value } = await it.next();
      if (done) controller.close();
      else controller.enqueue(value);
    },
    async cancel() {
      await it.return?.(undefined);
    },
  });
}
