// With the unmodified official client (npm `langsmith`), times create →
// first output (createSandbox, then run("echo hi")) POOL_N times and
// prints each and the median in ms. With POOL_WAIT=N it first waits until
// snapshot POOL_SNAPSHOT's warm pool has N ready instances, so each create
// can claim one with no refill boot running.
//
//   POOL_SNAPSHOT  snapshot id to create from
//   POOL_N         creates to time
//   POOL_PREFIX    sandbox name prefix
import { SandboxClient } from "langsmith/sandbox";

const client = new SandboxClient();
const snap = process.env.POOL_SNAPSHOT;
const wait = Number(process.env.POOL_WAIT || 0);
const poolReady = async () => {
  const r = await fetch(`${process.env.LANGSMITH_ENDPOINT}/v2/sandboxes/snapshots/${snap}/pool`, {
    headers: { "X-Api-Key": process.env.LANGSMITH_API_KEY },
  });
  return (await r.json()).ready;
};
const times = [];
try {
  for (let i = 0; i < Number(process.env.POOL_N); i++) {
    while (wait > 0 && (await poolReady()) < wait) await new Promise((r) => setTimeout(r, 20));
    const name = `${process.env.POOL_PREFIX}-${i}`;
    const t0 = performance.now();
    const sb = await client.createSandbox(snap, { name, timeout: 60 });
    const out = await sb.run("echo hi");
    const ms = performance.now() - t0;
    if (out.stdout !== "hi\n") throw new Error(`run: ${JSON.stringify(out)}`);
    times.push(ms);
    await sb.delete();
  }
  times.sort((a, b) => a - b);
  console.log(`times ${times.map((t) => t.toFixed(1)).join(" ")}`);
  console.log(`MEDIAN ${times[Math.floor(times.length / 2)].toFixed(1)}`);
} catch (err) {
  console.error(err);
  process.exit(1);
}
