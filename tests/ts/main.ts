// A producer in another language: a typed client generated from runner's OpenAPI document
// (openapi-typescript), calling it through openapi-fetch. The payload is type-checked
// against the function's JSON Schema at compile time.
import createClient from "openapi-fetch";
import type { paths } from "./api.js";

declare const process: { argv: string[] }; // node's, without its type package
const [baseUrl, token] = process.argv.slice(2);
const client = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${token}` } });

const { data, error, response } = await client.POST("/jobs/idem", {
  body: { k: "from-typescript", v: 42 },
  headers: { "Idempotency-Key": "ts-1" },
});
console.log(JSON.stringify({ status: response.status, data, error }));
