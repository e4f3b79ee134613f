// A scripted agent session with the unmodified official client (npm
// `langsmith`, with `ws`): create a sandbox with an egress rule, upload a
// tool, write files, "install" a package, reach the network through the
// proxy and on a raw TCP port, fail a command, have one killed by its
// timeout and run one under a PTY. The Go test then reads the sandbox's
// audit record and checks it against what happened here.
//
//   SESSION_SNAPSHOT  snapshot id       SESSION_NAME  sandbox name
//   SESSION_PROXY     proxy_config JSON SESSION_TOOL  host path of egclient
//   SESSION_CA        host path of the test CA
//   SESSION_WEB, SESSION_RAW  test internet addresses
import { readFileSync } from "node:fs";
import { SandboxClient, LangSmithCommandTimeoutError } from "langsmith/sandbox";

const env = process.env;
const client = new SandboxClient();
const out = (step, r) => console.log(`${step} exit=${r.exit_code ?? r.exitCode}`);
try {
  const sb = await client.createSandbox(env.SESSION_SNAPSHOT, {
    name: env.SESSION_NAME, timeout: 120, proxyConfig: JSON.parse(env.SESSION_PROXY),
  });
  await sb.write("/usr/local/bin/egclient", readFileSync(env.SESSION_TOOL));
  await sb.write("/tmp/inet-ca.pem", readFileSync(env.SESSION_CA));
  out("chmod", await sb.run("chmod +x /usr/local/bin/egclient"));
  await sb.write("/work/notes.txt", "first draft\n");
  await sb.write("/work/scratch.txt", "to be deleted\n");
  out("edit", await sb.run("echo second line >> /work/notes.txt && rm /work/scratch.txt && mkdir -p /work/out && echo done > /work/out/result"));
  out("install", await sb.run([
    "mkdir -p /var/lib/dpkg /usr/lib/python3/dist-packages/demo_pkg-1.4.2.dist-info",
    "printf 'Package: demo-tool\\nStatus: install ok installed\\nVersion: 0.9.1\\nArchitecture: all\\n\\n' >> /var/lib/dpkg/status",
    "printf 'Name: demo_pkg\\nVersion: 1.4.2\\n' > /usr/lib/python3/dist-packages/demo_pkg-1.4.2.dist-info/METADATA",
  ].join(" && ")));
  out("https", await sb.run(`egclient -to ${env.SESSION_WEB} -ca /tmp/inet-ca.pem https://secure.test/session`));
  out("tcp", await sb.run(`nc -w 3 ${env.SESSION_RAW} 7000`));
  out("fail", await sb.run("echo about to fail >&2; exit 3"));
  try {
    await sb.run("sleep 30", { timeout: 1 });
    throw new Error("a 1 s timeout did not kill sleep 30");
  } catch (err) {
    if (!(err instanceof LangSmithCommandTimeoutError)) throw err;
    console.log("timeout killed");
  }
  out("pty", await sb.run("tty", { pty: true }));
  console.log("SESSION PASSED");
} catch (err) {
  console.error(`FAIL ${err?.name}: ${err?.message}`);
  process.exitCode = 1;
}
