//! A minimal blocking HTTP/1.1 client for the master's operator endpoints (`/health`,
//! `/state`, `/weights`, `/quota`), used by `gantryctl` and the cluster tests. No TLS: the
//! operator endpoint is meant for loopback or a management network.

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
    #[error("{path}: {status}")]
    Status { path: String, status: String },
    #[error("malformed HTTP response from {0}")]
    Malformed(SocketAddr),
}

/// `GET path` and return the body of a 200 response.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<String, ClientError> {
    request(addr, "GET", path, None)
}

/// `POST path` with a JSON body and return the body of a 200 response.
pub fn http_post_json(
    addr: SocketAddr,
    path: &str,
    body: &serde_json::Value,
) -> Result<String, ClientError> {
    request(addr, "POST", path, Some(&body.to_string()))
}

fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<String, ClientError> {
    let io = |source| ClientError::Io { addr, source };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(io)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        ));
    } else {
        req.push_str("\r\n");
    }
    s.write_all(req.as_bytes()).map_err(io)?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(io)?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or(ClientError::Malformed(addr))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body).ok_or(ClientError::Malformed(addr))?
    } else {
        body.to_string()
    };
    let status = head.lines().next().unwrap_or_default();
    if !status.starts_with("HTTP/1.1 200") {
        let detail = if body.trim().is_empty() {
            String::new()
        } else {
            format!(": {}", body.trim())
        };
        return Err(ClientError::Status {
            path: path.to_string(),
            status: format!("{status}{detail}"),
        });
    }
    Ok(body)
}

fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let n = usize::from_str_radix(size.trim(), 16).ok()?;
        if n == 0 {
            return Some(out);
        }
        out.push_str(after.get(..n)?);
        rest = after.get(n + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dechunks() {
        assert_eq!(
            dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").as_deref(),
            Some("abcde")
        );
        assert_eq!(dechunk("ff\r\nabc"), None);
    }
}
