// Drives Cubicle's MCP door with the official TypeScript MCP client
// (@modelcontextprotocol/sdk), unmodified: the same full session over stdio
// (spawning `cubicle mcp`) and over streamable HTTP (the daemon's /mcp),
// then the HTTP door's authentication and tenancy. Prints "MCP PASSED".
//
// Env: CUBICLE_BIN, CUBICLE_ENDPOINT, CUBICLE_API_KEY (an admin of
// workspace A), OTHER_KEY (a key of another workspace), SNAPSHOT (a ready
// snapshot id).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import Ajv from "ajv";

const { CUBICLE_BIN, CUBICLE_ENDPOINT, CUBICLE_API_KEY, OTHER_KEY, SNAPSHOT } = process.env;
const MCP_URL = new URL("/mcp", CUBICLE_ENDPOINT);

const TOOLS = [
  "audit", "capture_snapshot", "create_sandbox", "delete_sandbox", "diff_sandboxes", "fork_sandbox",
  "kill_command", "list_files", "list_sandboxes", "read_file", "read_output", "reset_sandbox", "run_command",
  "search_files", "send_input", "service_url", "start_command", "stop_sandbox", "write_file",
];

function check(cond, msg) {
  if (!cond) throw new Error("check failed: " + msg);
}

// call returns a tool's structured result (the client has already
// validated it against the tool's output schema); a tool error throws.
async function call(client, name, args) {
  const res = await client.callTool({ name, arguments: args });
  if (res.isError) throw new Error(`${name}: ${res.content.map((c) => c.text).join("")}`);
  check(res.structuredContent, `${name} returned structured content`);
  check(res.content[0].type === "text" && JSON.parse(res.content[0].text), `${name} also returns its result as JSON text`);
  return res.structuredContent;
}

// toolError calls a tool that must fail and returns its message.
async function toolError(client, name, args) {
  const res = await client.callTool({ name, arguments: args });
  check(res.isError, `${name} ${JSON.stringify(args)} should fail`);
  return res.content.map((c) => c.text).join("");
}

async function checkTools(client) {
  const { tools } = await client.listTools();
  check(JSON.stringify(tools.map((t) => t.name).sort()) === JSON.stringify(TOOLS), "tool list: " + tools.map((t) => t.name));
  const ajv = new Ajv({ strict: false });
  for (const t of tools) {
    check(t.description && t.description.length > 30, `${t.name} is described`);
    check(t.inputSchema.type === "object", `${t.name} input schema is an object`);
    ajv.compile(t.inputSchema); // throws on an invalid schema
    check(t.outputSchema, `${t.name} has an output schema`);
    ajv.compile(t.outputSchema);
    for (const [prop, s] of Object.entries(t.inputSchema.properties ?? {})) {
      check(s.description, `${t.name}.${prop} is described`);
    }
  }
  const { resourceTemplates } = await client.listResourceTemplates();
  check(resourceTemplates.some((r) => r.uriTemplate === "cubicle://{sandbox}/{+path}"), "file resource template");
}

// fullSession: create, write a file, run it, a long-running command,
// fork, diff, read it back as a resource, the audit record, delete.
async function fullSession(client, label) {
  await checkTools(client);
  const name = `mcp-${label}`;
  const sb = await call(client, "create_sandbox", { snapshot: SNAPSHOT, name });
  check(sb.status === "ready" && sb.name === name, "created: " + JSON.stringify(sb));

  await call(client, "write_file", { sandbox: name, path: "/srv/mcp/hello.sh", content: 'echo "hello from $1"\necho oops >&2\nexit 7\n' });
  const run = await call(client, "run_command", { sandbox: name, command: `sh /srv/mcp/hello.sh ${label}` });
  check(run.stdout === `hello from ${label}\n` && run.stderr === "oops\n" && run.exit_code === 7, "run: " + JSON.stringify(run));

  const long = await call(client, "run_command", { sandbox: name, command: "seq 1 20000", max_bytes: 1000 });
  check(long.stdout_truncated && long.stdout.length <= 1000 && long.stdout_bytes === 108894, "paged: " + long.stdout_bytes);
  const page2 = await call(client, "read_output", { command_id: long.command_id, stdout_offset: long.next_stdout_offset, max_bytes: 1000 });
  check(page2.stdout_offset === long.next_stdout_offset && page2.stdout.length > 0, "second page");

  const cat = await call(client, "start_command", { sandbox: name, command: "cat" });
  check(cat.running, "cat runs");
  await call(client, "send_input", { command_id: cat.command_id, input: "ping\n" });
  const echoed = await call(client, "read_output", { command_id: cat.command_id, wait_seconds: 10 });
  check(echoed.stdout === "ping\n", "cat echoed: " + JSON.stringify(echoed));
  const killed = await call(client, "kill_command", { command_id: cat.command_id });
  check(!killed.running && killed.error.includes("killed"), "killed: " + JSON.stringify(killed));

  const listed = await call(client, "list_files", { sandbox: name, pattern: "*.sh", path: "/srv/mcp" });
  check(listed.files.some((f) => f.path === "/srv/mcp/hello.sh"), "list_files");
  const found = await call(client, "search_files", { sandbox: name, pattern: "hello from", path: "/srv/mcp" });
  check(found.matches.length === 1 && found.matches[0].line === 1, "search_files: " + JSON.stringify(found));
  const read = await call(client, "read_file", { sandbox: name, path: "/srv/mcp/hello.sh", offset: 5, max_bytes: 4 });
  check(read.content === '"hel' && read.truncated && read.next_offset === 9, "read_file page: " + JSON.stringify(read));
  const res = await client.readResource({ uri: `cubicle://${name}/srv/mcp/hello.sh` });
  check(res.contents[0].text.startsWith('echo "hello'), "resource read");

  const fork = await call(client, "fork_sandbox", { sandbox: name, names: [`${name}-b`] });
  check(fork.sandboxes.length === 1 && fork.sandboxes[0].status === "ready", "fork: " + JSON.stringify(fork));
  const branch = fork.sandboxes[0].name;
  const inBranch = await call(client, "run_command", { sandbox: branch, command: "cat /srv/mcp/hello.sh >/dev/null && echo new > /srv/mcp/new.txt" });
  check(inBranch.exit_code === 0, "the branch has the parent's file");
  const diff = await call(client, "diff_sandboxes", { a: name, b: branch });
  check(diff.changes.some((c) => c.path === "/srv/mcp/new.txt" && c.kind === "added"), "diff: " + JSON.stringify(diff));

  const audit = await call(client, "audit", { sandbox: name, kinds: ["command"] });
  const started = audit.events.filter((e) => e.type === "command.started");
  check(started.some((e) => e.data.door === "mcp" && e.data.command.includes("hello.sh")), "audit door: " + JSON.stringify(started));
  check(started.every((e) => e.data.door === "mcp"), "every command came through the MCP door");
  const files = await call(client, "audit", { sandbox: name, kinds: ["file"] });
  const upload = files.events.find((e) => e.type === "file.uploaded");
  check(upload && upload.data.door === "mcp", "the upload came through the MCP door: " + JSON.stringify(files.events));

  await call(client, "delete_sandbox", { sandbox: branch });
  return name; // kept for the tenancy checks; deleted by the caller
}

async function stdioSession() {
  const client = new Client({ name: "cubicle-e2e", version: "1.0.0" });
  const transport = new StdioClientTransport({
    command: CUBICLE_BIN, args: ["mcp"], stderr: "inherit",
    env: { PATH: process.env.PATH, CUBICLE_ENDPOINT, CUBICLE_API_KEY },
  });
  await client.connect(transport);
  const name = await fullSession(client, "stdio");
  await call(client, "delete_sandbox", { sandbox: name });
  await client.close();
  console.log("stdio session ok");
}

function httpClient(headers) {
  const client = new Client({ name: "cubicle-e2e", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(MCP_URL, { requestInit: { headers } });
  return { client, transport };
}

async function httpSession() {
  // MCP hosts send the key as a bearer token.
  const { client, transport } = httpClient({ Authorization: `Bearer ${CUBICLE_API_KEY}` });
  await client.connect(transport);
  const name = await fullSession(client, "http");

  // Another workspace's key sees none of it.
  const other = httpClient({ "X-Api-Key": OTHER_KEY });
  await other.client.connect(other.transport);
  const theirs = await call(other.client, "list_sandboxes", {});
  check(!theirs.sandboxes.some((s) => s.name === name), "the other workspace does not list the sandbox");
  const msg = await toolError(other.client, "run_command", { sandbox: name, command: "true" });
  check(msg.includes("404"), "the other workspace cannot run in it: " + msg);
  check((await toolError(other.client, "delete_sandbox", { sandbox: name })).includes("404"), "nor delete it");

  // Nor can it ride the first key's session.
  const hijack = await fetch(MCP_URL, {
    method: "POST",
    headers: { "X-Api-Key": OTHER_KEY, "Mcp-Session-Id": transport.sessionId, "Content-Type": "application/json",
      Accept: "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 99, method: "tools/call", params: { name: "delete_sandbox", arguments: { sandbox: name } } }),
  });
  check(hijack.status === 403, "another key on the session: " + hijack.status);
  await other.client.close();

  await call(client, "delete_sandbox", { sandbox: name });
  await transport.terminateSession();
  await client.close();
  console.log("http session ok");
}

async function httpAuth() {
  for (const headers of [{}, { "X-Api-Key": "nope" }, { Authorization: "Bearer nope" }]) {
    const res = await fetch(MCP_URL, {
      method: "POST", headers: { ...headers, "Content-Type": "application/json", Accept: "application/json, text/event-stream" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "x", version: "1" } } }),
    });
    check(res.status === 401, `initialize with ${JSON.stringify(headers)}: ${res.status}`);
  }
  const { client, transport } = httpClient({});
  let refused = false;
  try {
    await client.connect(transport);
  } catch (e) {
    refused = true;
  }
  check(refused, "the client cannot connect without a key");
  console.log("http auth ok");
}

await httpAuth();
await stdioSession();
await httpSession();
console.log("MCP PASSED");
