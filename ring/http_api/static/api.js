// Calls to this broker's client API with the client token the user saved;
// a failed call is an ApiError carrying the API's {"error", "message"}.

export const TOKEN_KEY = "ring.admin.token";

export class ApiError extends Error {
  constructor(status, body, text) {
    const code = body && body.error ? body.error : `http_${status}`;
    const message = body && body.message ? body.message : (text || "").slice(0, 200) || "no details";
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.body = body;
  }
}

// Tokens are 64-bit: read them exactly where the browser allows it (JSON.parse source access).
function reviver(key, value, context) {
  if (key === "token" && typeof value === "number" && context && typeof context.source === "string") {
    return BigInt(context.source);
  }
  return value;
}

export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  const token = localStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (exc) {
    throw new ApiError(0, { error: "unreachable", message: `the broker did not answer (${exc.message})` });
  }
  const text = await resp.text();
  let doc = null;
  try { doc = text ? JSON.parse(text, reviver) : null; } catch { doc = null; }
  if (!resp.ok) throw new ApiError(resp.status, doc, text);
  return doc;
}
