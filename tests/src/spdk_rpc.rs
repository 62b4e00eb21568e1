//! One call on the JSON-RPC socket of an SPDK (an agent's `spdk.rpcSocket`, a stock
//! `nvmf_tgt`'s): what tests use to look at what SPDK itself holds, beside what the agent
//! reports.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

/// Sends `method` with `params` (none when `Value::Null`) and returns its `result`; the whole
/// reply as the error when it has none (SPDK's `error` object), or what failed on the socket.
/// Waits at most 10 s for the reply.
pub fn rpc(sock: &Path, method: &str, params: Value) -> Result<Value, String> {
    let mut s = UnixStream::connect(sock).map_err(|e| format!("{}: {e}", sock.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let req = if params.is_null() {
        json!({"jsonrpc": "2.0", "method": method, "id": 1})
    } else {
        json!({"jsonrpc": "2.0", "method": method, "params": params, "id": 1})
    };
    s.write_all(req.to_string().as_bytes())
        .map_err(|e| e.to_string())?;
    let reply: Value = serde_json::Deserializer::from_reader(&s)
        .into_iter::<Value>()
        .next()
        .ok_or("no reply")?
        .map_err(|e| e.to_string())?;
    match reply.get("result") {
        Some(r) => Ok(r.clone()),
        None => Err(reply.to_string()),
    }
}
