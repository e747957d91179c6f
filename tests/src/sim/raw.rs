//! A minimal HTTP/1.1 client for the simulator's control endpoints and for tests that
//! need raw status codes and headers (e.g. `Retry-After`). One request per connection.

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A raw HTTP response.
#[derive(Debug, Clone)]
pub struct RawResponse {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// Body (de-chunked).
    pub body: Vec<u8>,
}

impl RawResponse {
    /// First header with this (lower-case) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    /// Body parsed as JSON (`Value::Null` if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(pos) = b.windows(2).position(|w| w == b"\r\n") {
        let len = usize::from_str_radix(std::str::from_utf8(&b[..pos]).unwrap_or("0").trim(), 16)
            .unwrap_or(0);
        if len == 0 {
            break;
        }
        let start = pos + 2;
        if b.len() < start + len {
            out.extend_from_slice(&b[start..]);
            break;
        }
        out.extend_from_slice(&b[start..start + len]);
        b = &b[(start + len + 2).min(b.len())..];
    }
    out
}

/// Send one request (`Connection: close`) and read the whole response.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> std::io::Result<RawResponse> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if let Some(ct) = content_type {
        req.push_str(&format!("Content-Type: {ct}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await?;
    s.write_all(body).await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(buf.len());
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    let rest = if split + 4 <= buf.len() {
        &buf[split + 4..]
    } else {
        &[][..]
    };
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Ok(RawResponse {
        status,
        headers,
        body,
    })
}
