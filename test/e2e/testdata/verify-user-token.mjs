// Verifies the tokens in USER_TOKEN and FORGED_TOKEN with the official
// client's SandboxTokenVerifier against the daemon's JWKS, as an app behind
// a LangSmith-login service URL would, and prints one line for each.
import { SandboxTokenVerifier } from "langsmith/sandbox";

const endpoint = process.env.LANGSMITH_ENDPOINT;
const verifier = new SandboxTokenVerifier({ apiUrl: endpoint });
for (const [label, token] of [["real", process.env.USER_TOKEN], ["forged", process.env.FORGED_TOKEN]]) {
  try {
    const u = await verifier.verifyUserToken(token, { audience: process.env.AUDIENCE, issuer: endpoint });
    console.log(`${label}: OK sub=${u.subject} email=${u.email ?? ""} name=${u.name ?? ""}`);
  } catch (e) {
    console.log(`${label}: REJECTED ${e.message}`);
  }
}
