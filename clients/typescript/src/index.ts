// The package's entry: the WebUI client, its errors and the route types.

export { ScopefsClient, type ClientOptions, type UploadFile } from "./client.js";
export { ScopefsError, ScopefsUnreachable, type ErrorBody } from "./errors.js";
export type { Content, Part } from "./multipart.js";
export type { Answer, RequestBody, Operation, Path, Method, paths, components } from "./types.js";
export { canonicalJson, pythonFloat, signedBody, tokenOf, type AuthContext, type Json } from "./signing.js";
