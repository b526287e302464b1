// The error a scopefs answer carries: every non-2xx answer of the daemon is
// `{"error": {"code", "message", ...details}}`; this keeps its status, code and details.

/** The body of every error answer. */
export interface ErrorBody {
  error: { code: string; message: string; [detail: string]: unknown };
}

/** A non-2xx answer of the daemon. `code` is the API's error code (`scope_not_found`, ...). */
export class ScopefsError extends Error {
  readonly status: number;
  readonly code: string;
  /** The error object's other fields (e.g. `retry_after_secs`, `limit`). */
  readonly details: Record<string, unknown>;

  constructor(status: number, code: string, message: string, details: Record<string, unknown>) {
    super(`${status} ${code}: ${message}`);
    this.name = "ScopefsError";
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

/** The daemon could not be reached at all (connection refused, reset, DNS). */
export class ScopefsUnreachable extends Error {
  constructor(cause: unknown) {
    super("scopefs is unreachable", { cause });
    this.name = "ScopefsUnreachable";
  }
}

/** Builds the error of a non-2xx answer (its body is read; a body that is not the API's error form
 * gives code `http_<status>`). */
export async function errorOf(resp: Response): Promise<ScopefsError> {
  let text = "";
  try {
    text = await resp.text();
  } catch {
    // The body could not be read: the status alone describes the failure.
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  if (isErrorBody(parsed)) {
    const { code, message, ...details } = parsed.error;
    return new ScopefsError(resp.status, code, message, details);
  }
  return new ScopefsError(resp.status, `http_${resp.status}`, resp.statusText || "unexpected answer", {});
}

function isErrorBody(v: unknown): v is ErrorBody {
  if (typeof v !== "object" || v === null || !("error" in v)) return false;
  const e = (v as { error: unknown }).error;
  return (
    typeof e === "object" &&
    e !== null &&
    typeof (e as { code?: unknown }).code === "string" &&
    typeof (e as { message?: unknown }).message === "string"
  );
}
