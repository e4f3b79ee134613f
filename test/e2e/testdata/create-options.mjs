// With the unmodified official client (npm `langsmith` 0.12), exercises
// the 0.12 create and list options against the daemon: labels (create,
// filter, inherit from a snapshot), persistent: false, snapshot tags
// (capture with a tag, create by snapshotName "name:tag", the tags of a
// name), cpu_millicores, and list paging with cursor, page_size, sort and
// created_by=me. Members the 0.12 client has no option for go through its
// own authenticated _fetch, as a caller of the REST API would send them.
//
//   OPTS_SNAPSHOT  id of a ready snapshot to create from
import { SandboxClient } from "langsmith/sandbox";

const client = new SandboxClient();
const snap = process.env.OPTS_SNAPSHOT;
const check = (what, cond, got) => {
  if (!cond) throw new Error(`${what}: got ${JSON.stringify(got)}`);
  console.log(`ok   ${what}`);
};
const api = async (method, path, body) => {
  const resp = await client._fetch(`${client._baseUrl}${path}`, {
    method,
    headers: { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await resp.json();
  if (!resp.ok) throw new Error(`${method} ${path}: ${resp.status} ${JSON.stringify(data)}`);
  return data;
};
const names = (list) => list.map((s) => s.name);

const a = await client.createSandbox(snap, { name: "opt-a", labels: { team: "red", env: "dev" }, timeout: 60 });
check("create with labels", a.labels?.team === "red" && a.labels?.env === "dev", a.labels);
const b = await client.createSandbox(snap, { name: "opt-b", labels: { team: "blue" }, persistent: false, timeout: 60 });
check("create persistent: false", b.labels?.team === "blue", b.labels);

let page = await api("GET", "/boxes?label=team=red");
check("list label=team=red", JSON.stringify(names(page.sandboxes)) === '["opt-a"]', names(page.sandboxes));
page = await api("GET", "/boxes?label=team&label=env=dev");
check("list label=team&label=env=dev", JSON.stringify(names(page.sandboxes)) === '["opt-a"]', names(page.sandboxes));

await a.run("echo captured > /marker");
const latest = await client.captureSnapshot("opt-a", "opt-snap", { timeout: 60 });
const tagged = await api("POST", "/boxes/opt-a/snapshot", { name: "opt-snap", tag: "v1" });
const tags = await api("GET", "/snapshots-by-name/opt-snap");
check("snapshots-by-name lists latest and v1",
  tags.name === "opt-snap" && tags.tags.some((t) => t.tag === "latest" && t.snapshot_id === latest.id) &&
  tags.tags.some((t) => t.tag === "v1" && t.snapshot_id === tagged.id), tags);
const c = await client.createSandbox({ snapshotName: "opt-snap:v1", name: "opt-c", labels: { env: "prod" }, timeout: 60 });
check("create from name:tag inherits the snapshot's labels", c.snapshot_id === tagged.id && c.labels?.team === "red" && c.labels?.env === "prod", c);
const marker = await c.run("cat /marker");
check("the tagged snapshot has the captured file", marker.stdout.trim() === "captured", marker);

const d = await api("POST", "/boxes", { name: "opt-d", snapshot_id: snap, cpu_millicores: 500 });
check("cpu_millicores 500 is 1 vCPU", d.cpu_millicores === 500 && d.vcpus === 1, d);
const got = await client.getSandbox("opt-d");
check("getSandbox reads it", got.vCpus === 1, got.vCpus);

await b.run("echo gone > /scratch");
await client.stopSandbox("opt-b");
await client.startSandbox("opt-b", { timeout: 60 });
const scratch = await (await client.getSandbox("opt-b")).run("cat /scratch 2>/dev/null || echo absent");
check("persistent: false drops the filesystem at a stop", scratch.stdout.trim() === "absent", scratch);

const all = [];
let cursor = null;
for (let i = 0; i < 10; i++) {
  const q = `/boxes?page_size=2&sort_by=name&sort_order=desc&created_by=me${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
  page = await api("GET", q);
  all.push(...names(page.sandboxes));
  cursor = page.next_cursor;
  if (!cursor) break;
}
check("cursor paging by name desc walks every sandbox once", JSON.stringify(all) === '["opt-d","opt-c","opt-b","opt-a"]', all);
const listed = await client.listSandboxes();
check("listSandboxes still lists them", listed.length === 4, names(listed));
console.log("CREATE OPTIONS CLIENT PASSED");
