// Request and answer types of the daemon's routes, read from the OpenAPI document's generated
// types (`schema.ts`, made by `openapi-typescript` from `/openapi.json`; never edited by hand).

import type { paths } from "./schema.js";

export type { paths, components } from "./schema.js";

export type Path = keyof paths;
export type Method = "get" | "put" | "post" | "patch" | "delete";

/** The operation of `method` on `path` in the document. */
export type Operation<P extends Path, M extends Method> = M extends keyof paths[P] ? paths[P][M] : never;

type OrUnknown<T> = [T] extends [never] ? unknown : T;
type JsonContent<X> = X extends { content: { "application/json": infer B } } ? B : never;

/** The JSON body of an operation's 2xx answers (`unknown` where the document gives none). */
export type Answer<P extends Path, M extends Method> =
  Operation<P, M> extends { responses: infer R }
    ? OrUnknown<{ [K in keyof R]: K extends 200 | 201 | 202 ? JsonContent<R[K]> : never }[keyof R]>
    : unknown;

/** The JSON request body of an operation (a plain object where the document gives none). */
export type RequestBody<P extends Path, M extends Method> =
  Operation<P, M> extends { requestBody?: infer B }
    ? [JsonContent<NonNullable<B>>] extends [never]
      ? Record<string, unknown>
      : JsonContent<NonNullable<B>>
    : Record<string, unknown>;
