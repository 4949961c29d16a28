//! A real, single-member etcd server for tests.
//!
//! [`EtcdServer::start`] launches Debian's `etcd` binary (package `etcd-server`) on free loopback
//! client and peer ports with a fresh temporary data directory and waits until its `/health`
//! endpoint reports healthy. The server can be killed (`SIGKILL`, like a crash) and restarted on
//! the same data directory and the same ports, so clients configured with [`EtcdServer::client_url`]
//! reconnect to it. Dropping the value kills the process and removes the data directory.
//!
//! The harness is synchronous (std processes and sockets) so it works from plain tests and from
//! tokio tests alike; inside a multi-threaded tokio runtime wrap the slow calls (`start`,
//! `restart`) in `tokio::task::block_in_place`.
//!
//! Part of the dev-only `gantry-test-support` crate, used by `gantry-master`'s integration tests
//! and benchmarks and by the cluster tests of `gantry-tests`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Where Debian installs etcd; `$GANTRY_ETCD_BIN` overrides it.
const DEFAULT_ETCD_BIN: &str = "/usr/bin/etcd";
/// How long a start or restart may take before the harness gives up.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How many times `start` retries with new ports when the first pair was taken meanwhile.
const START_ATTEMPTS: usize = 3;

/// A running (or killed) etcd server owned by a test.
pub struct EtcdServer {
    bin: PathBuf,
    data: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// The etcd binary to run, or a clear error saying how to install it.
fn etcd_binary() -> anyhow::Result<PathBuf> {
    let bin = std::env::var_os("GANTRY_ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ETCD_BIN));
    if bin.is_file() {
        return Ok(bin);
    }
    // Fall back to a search of $PATH before giving up.
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("etcd");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!(
        "the etcd server binary was not found at {} nor on $PATH; install it with \
         `sudo apt-get install etcd-server` (Debian/Ubuntu) or point $GANTRY_ETCD_BIN at an etcd 3.4+ binary",
        bin.display()
    )
}

/// A loopback port that was free a moment ago.
fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding a probe port")?;
    Ok(listener.local_addr()?.port())
}

impl EtcdServer {
    /// Starts a fresh single-member etcd on free loopback ports and waits until it is healthy.
    pub fn start() -> anyhow::Result<EtcdServer> {
        let bin = etcd_binary()?;
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let data = tempfile::Builder::new()
                .prefix("gantry-etcd-")
                .tempdir()
                .context("creating the etcd data directory")?;
            let client_port = free_port()?;
            let mut peer_port = free_port()?;
            while peer_port == client_port {
                peer_port = free_port()?;
            }
            let mut server = EtcdServer {
                bin: bin.clone(),
                data,
                client_port,
                peer_port,
                child: None,
            };
            // On failure (e.g. a port taken meanwhile) `server` is dropped: killed, dir removed.
            match server.launch() {
                Ok(()) => return Ok(server),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("etcd did not start")))
    }

    fn member_dir(&self) -> PathBuf {
        self.data.path().join("data")
    }

    /// `http://127.0.0.1:PORT`, the URL clients connect to.
    pub fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The client socket address.
    pub fn client_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    /// The directory holding etcd's data and its log file.
    pub fn dir(&self) -> &Path {
        self.data.path()
    }

    /// Whether the process is currently running (not killed, not exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills the server with SIGKILL (as a crash would) and waits for it to exit. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs and starts it again on the same data dir and ports.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.launch()
    }

    /// The tail of etcd's log, for test failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.data.path().join("etcd.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn launch(&mut self) -> anyhow::Result<()> {
        let client = self.client_url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log_path = self.data.path().join("etcd.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let log_err = log.try_clone()?;
        let child = Command::new(&self.bin)
            .arg("--name")
            .arg("gantry-test")
            .arg("--data-dir")
            .arg(self.member_dir())
            .arg("--listen-client-urls")
            .arg(&client)
            .arg("--advertise-client-urls")
            .arg(&client)
            .arg("--listen-peer-urls")
            .arg(&peer)
            .arg("--initial-advertise-peer-urls")
            .arg(&peer)
            .arg("--initial-cluster")
            .arg(format!("gantry-test={peer}"))
            .arg("--initial-cluster-state")
            .arg("new")
            // A single member elects itself quickly with short raft timers.
            .arg("--heartbeat-interval")
            .arg("50")
            .arg("--election-timeout")
            .arg("500")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .spawn()
            .with_context(|| format!("spawning {}", self.bin.display()))?;
        self.child = Some(child);
        self.wait_healthy()
    }

    fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    bail!(
                        "etcd exited during start-up with {status}; log tail:\n{}",
                        self.log_tail(20)
                    );
                }
            }
            if health_ok(self.client_addr()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "etcd on {} did not become healthy within {:?}; log tail:\n{}",
                    self.client_url(),
                    START_TIMEOUT,
                    self.log_tail(20)
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

/// One `GET /health` over plain HTTP/1.0; true when etcd says `"health":"true"`.
fn health_ok(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    if stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut body = String::new();
    if stream.read_to_string(&mut body).is_err() {
        return false;
    }
    body.contains("\"health\":\"true\"")
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn starts_kills_and_restarts_on_the_same_port() {
        let mut etcd = super::EtcdServer::start().expect("etcd starts");
        assert!(super::health_ok(etcd.client_addr()));
        let url = etcd.client_url();
        etcd.kill();
        assert!(!etcd.is_running());
        assert!(!super::health_ok(etcd.client_addr()));
        etcd.restart().expect("etcd restarts");
        assert_eq!(url, etcd.client_url());
        assert!(etcd.is_running());
        assert!(super::health_ok(etcd.client_addr()));
        let dir = etcd.dir().to_path_buf();
        drop(etcd);
        assert!(!dir.exists(), "data dir removed on drop");
    }
}
