//! `GET http://…/metrics`: a plain HTTP/1.0 request (the agents serve metrics without TLS),
//! bounded in time and size.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest body read (an agent with a few hundred volumes serves well under 1 MiB).
const MAX_BODY: u64 = 32 << 20;

/// `host:port` and path of an `http://` URL.
pub fn split_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: only http:// URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/metrics"),
    };
    if authority.is_empty() {
        return Err(format!("{url}: no host"));
    }
    // A port is needed unless the host is the whole authority (`[v6]` or a name).
    let has_port = match authority.rfind(']') {
        Some(end) => authority[end..].contains(':'),
        None => authority.contains(':'),
    };
    let authority = if has_port {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok((authority, path.to_string()))
}

/// The body of a chunked transfer.
fn dechunk(body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk size line is not terminated")?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if rest.len() < size {
            return Err("a chunk is cut short".into());
        }
        out.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
}

/// The body of a complete HTTP response, or why it is not a 200.
pub fn body_of(response: &[u8]) -> Result<String, String> {
    let head_end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer is not HTTP")?;
    let head = String::from_utf8_lossy(&response[..head_end]);
    let status = head.lines().next().unwrap_or("");
    let code = status.split_whitespace().nth(1).unwrap_or("");
    if !status.starts_with("HTTP/") {
        return Err("the answer is not HTTP".into());
    }
    if code != "200" {
        return Err(format!(
            "HTTP {}",
            status.split_once(' ').map_or("", |x| x.1)
        ));
    }
    let body = &response[head_end + 4..];
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    String::from_utf8(body).map_err(|_| "the body is not UTF-8".to_string())
}

/// The body of `GET url`, within `timeout`.
pub async fn get(url: &str, timeout: Duration) -> Result<String, String> {
    let (authority, path) = split_url(url)?;
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(&authority)
            .await
            .map_err(|e| e.to_string())?;
        let host = authority.clone();
        let req = format!(
            "GET {path} HTTP/1.0\r\nHost: {host}\r\nAccept: text/plain\r\nUser-Agent: kubectl-liteio\r\n\r\n"
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        (&mut s)
            .take(MAX_BODY)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| e.to_string())?;
        body_of(&buf)
    };
    tokio::time::timeout(timeout, fetch)
        .await
        .map_err(|_| format!("no answer within {} s", timeout.as_secs_f64()))?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            split_url("http://10.0.0.5:9810/metrics").unwrap(),
            ("10.0.0.5:9810".into(), "/metrics".into())
        );
        assert_eq!(
            split_url("http://[fd00::5]:9810").unwrap(),
            ("[fd00::5]:9810".into(), "/metrics".into())
        );
        assert_eq!(
            split_url("http://agent/m").unwrap(),
            ("agent:80".into(), "/m".into())
        );
        assert!(split_url("https://x/metrics").is_err());
        assert!(split_url("http:///metrics").is_err());
    }

    #[test]
    fn bodies() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nx 1\n";
        assert_eq!(body_of(ok).unwrap(), "x 1\n");
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nx 1\r\n1\r\n\n\r\n0\r\n\r\n";
        assert_eq!(body_of(chunked).unwrap(), "x 1\n");
        let e = body_of(b"HTTP/1.1 404 Not Found\r\n\r\nnot found\n").unwrap_err();
        assert_eq!(e, "HTTP 404 Not Found");
        assert!(body_of(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
    }
}
