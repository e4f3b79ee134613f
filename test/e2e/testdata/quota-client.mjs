// With the unmodified official client (npm `langsmith`), expects the
// daemon to refuse a create — and, with QUOTA_START, a start — as over
// quota: LangSmithQuotaExceededError with quotaType QUOTA_EXPECT.
//
//   QUOTA_SNAPSHOT  snapshot id to create from
//   QUOTA_CREATE    JSON CreateSandboxOptions (vCpus, memBytes, ...)
//   QUOTA_EXPECT    the quotaType the client must report
//   QUOTA_START     optional: name of a stopped sandbox whose start is refused
import { SandboxClient, LangSmithQuotaExceededError } from "langsmith/sandbox";

const expect = process.env.QUOTA_EXPECT;
const client = new SandboxClient();
const refused = async (what, call) => {
  try {
    await call();
  } catch (err) {
    if (err instanceof LangSmithQuotaExceededError && err.quotaType === expect) {
      console.log(`ok   ${what}: ${err.name} quotaType=${err.quotaType}: ${err.message}`);
      return;
    }
    throw new Error(`${what}: got ${err?.name} quotaType=${err?.quotaType}: ${err?.message}; want quotaType ${expect}`);
  }
  throw new Error(`${what}: succeeded; want LangSmithQuotaExceededError(${expect})`);
};
try {
  const opts = { timeout: 60, ...JSON.parse(process.env.QUOTA_CREATE || "{}") };
  await refused("create", () => client.createSandbox(process.env.QUOTA_SNAPSHOT, opts));
  if (process.env.QUOTA_START) {
    await refused("start", () => client.startSandbox(process.env.QUOTA_START, { timeout: 60 }));
  }
  console.log("QUOTA CLIENT PASSED");
} catch (err) {
  console.error(`FAIL ${err.message}`);
  process.exitCode = 1;
}
