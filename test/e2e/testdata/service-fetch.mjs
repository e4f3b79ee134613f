// ServiceUrl.fetch() of the official client against Cubicle's gateway: the
// client mints a service URL, then uses the global fetch with only the
// X-Langsmith-Sandbox-Service-Token header (no API key).
//
//   LANGSMITH_ENDPOINT=... LANGSMITH_API_KEY=... SANDBOX=<name> node service-fetch.mjs
import { SandboxClient } from "langsmith/sandbox";

const client = new SandboxClient();
const su = await client.serviceUrl(process.env.SANDBOX, { port: 8000, expiresInSeconds: 600 });
const expires = Date.parse(await su.expiresAt());
if (Number.isNaN(expires) || expires < Date.now()) throw new Error(`bad expires_at ${await su.expiresAt()}`);
const res = await su.fetch("/index.html");
const text = await res.text();
if (res.status !== 200 || text !== "hello from inside the sandbox\n") {
  console.error(`status=${res.status} body=${JSON.stringify(text)}`);
  process.exit(1);
}
const bare = await fetch(`${await su.serviceUrl()}/index.html`);
if (bare.status !== 401) {
  console.error(`no token: status=${bare.status}`);
  process.exit(1);
}
console.log("FETCH OK");
