//! A minimal blocking HTTP/1.1 client for the master's operator endpoints (`/health`,
//! `/state`), used by `gantryctl` and the cluster tests. Loopback and LAN only; no TLS.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Errors talking to the operator endpoints.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{addr}: {source}")]
    Io {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("GET {path}: {status}")]
    Status { path: String, status: String },
    #[error("malformed HTTP response from {0}")]
    Malformed(SocketAddr),
}

/// `GET path` and return the body of a 200 response.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<String, ClientError> {
    let io = |source| ClientError::Io { addr, source };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(io)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(io)?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(io)?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or(ClientError::Malformed(addr))?;
    let status = head.lines().next().unwrap_or_default();
    if !status.starts_with("HTTP/1.1 200") {
        return Err(ClientError::Status {
            path: path.to_string(),
            status: status.to_string(),
        });
    }
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok(body.to_string());
    }
    let mut out = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest
            .split_once("\r\n")
            .ok_or(ClientError::Malformed(addr))?;
        let n = usize::from_str_radix(size.trim(), 16).map_err(|_| ClientError::Malformed(addr))?;
        if n == 0 || after.len() < n + 2 {
            break;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    Ok(out)
}
