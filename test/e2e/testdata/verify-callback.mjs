// Verifies a proxy callback request (CALLBACK_BODY, CALLBACK_SIGNATURE,
// configured at CALLBACK_URL) with the official client's
// SandboxTokenVerifier against the daemon's JWKS, as a callback endpoint
// would, and prints the verified payload or the error.
import { SandboxTokenVerifier } from "langsmith/sandbox";

const verifier = new SandboxTokenVerifier({ apiUrl: process.env.LANGSMITH_ENDPOINT });
for (const [label, body] of [["real", process.env.CALLBACK_BODY], ["tampered", process.env.CALLBACK_BODY + " "]]) {
  try {
    const cb = await verifier.verifyCallback({ body, signature: process.env.CALLBACK_SIGNATURE, url: process.env.CALLBACK_URL });
    console.log(`${label}: OK host=${cb.host} port=${cb.port} sandbox=${cb.identity.sandbox_id} tenant=${cb.identity.tenant_id}`);
  } catch (e) {
    console.log(`${label}: REJECTED ${e.message}`);
  }
}
