//! The floor: the round trip of a bare QUIC ping over the same loopback with the same TLS as
//! the master's peers (the master's certificate on the server side, a framework certificate on
//! the client side, [`quic::server_endpoint`] / [`quic::client_config`] and the codec's frames),
//! with nothing of the master in between.
//!
//! Two echo servers: one in this process ([`EchoServer`], the harness's own runtime), and one
//! in a process of its own ([`EchoProcess`], `gantry-load --serve-echo`). A message through
//! the master crosses processes twice, as the ping to the second does; the ping to the first
//! may be answered without the kernel waking another process or core.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use gantry_sdk::transport::quic::{self, FrameReceiver, FrameSender};
use gantry_sdk::transport::tls::{self, PeerIdentity};

use super::stats::Samples;

/// An echo server: every frame (a `u64`) on a stream is sent back.
pub struct EchoServer {
    endpoint: quinn::Endpoint,
    pub addr: SocketAddr,
}

impl EchoServer {
    /// Binds a loopback port with the master's TLS material from `tls_dir`.
    pub fn start(tls_dir: &Path) -> anyhow::Result<Self> {
        let material = gantry_pki::load_or_issue(tls_dir, &PeerIdentity::Master, &[])?;
        let mut key = vec![0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
            .map_err(|_| anyhow::anyhow!("no system randomness"))?;
        let endpoint = quic::server_endpoint("127.0.0.1:0".parse()?, &material, &key)?;
        let addr = endpoint.local_addr()?;
        let ep = endpoint.clone();
        tokio::spawn(async move {
            while let Some(incoming) = ep.accept().await {
                tokio::spawn(async move {
                    let Ok(conn) = incoming.await else { return };
                    while let Ok((send, recv)) = conn.accept_bi().await {
                        tokio::spawn(async move {
                            let (mut tx, mut rx) = (FrameSender(send), FrameReceiver(recv));
                            while let Ok(n) = rx.recv::<u64>().await {
                                if tx.send(&n).await.is_err() {
                                    break;
                                }
                            }
                        });
                    }
                });
            }
        });
        Ok(Self { endpoint, addr })
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.endpoint.close(0u32.into(), b"done");
    }
}

/// Serves an [`EchoServer`] until standard input closes (`gantry-load --serve-echo`): prints
/// its address as the first line on standard output. The parent holds the other end of
/// standard input, so the server ends with it however the parent ends.
pub async fn serve_echo(tls_dir: &Path) -> anyhow::Result<()> {
    let server = EchoServer::start(tls_dir)?;
    println!("{}", server.addr);
    tokio::task::spawn_blocking(|| std::io::stdin().read_to_end(&mut Vec::new())).await??;
    Ok(())
}

/// An [`EchoServer`] in a child process (`exe --serve-echo --tls-dir DIR`), killed on drop.
pub struct EchoProcess {
    child: Child,
    pub addr: SocketAddr,
}

impl EchoProcess {
    /// Starts `exe` (a `gantry-load` binary) and reads the address it serves on. Blocking.
    pub fn spawn(exe: &Path, tls_dir: &Path) -> anyhow::Result<Self> {
        let mut child = Command::new(exe)
            .arg("--serve-echo")
            .arg("--tls-dir")
            .arg(tls_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {} --serve-echo", exe.display()))?;
        let mut line = String::new();
        let read = child
            .stdout
            .take()
            .map(|out| BufReader::new(out).read_line(&mut line));
        let addr = match read {
            Some(Ok(_)) => line.trim().parse::<SocketAddr>().ok(),
            _ => None,
        };
        let Some(addr) = addr else {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!(
                "{} --serve-echo printed no address ({line:?})",
                exe.display()
            );
        };
        Ok(Self { child, addr })
    }
}

impl Drop for EchoProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client connected to an [`EchoServer`] with a framework certificate.
pub struct Pinger {
    conn: quinn::Connection,
    tx: FrameSender,
    rx: FrameReceiver,
    seq: u64,
}

impl Pinger {
    pub async fn connect(tls_dir: &Path, server: SocketAddr) -> anyhow::Result<Self> {
        let material = tokio::task::block_in_place(|| {
            gantry_pki::load_or_issue(tls_dir, &PeerIdentity::Framework("load-ping".into()), &[])
        })?;
        let endpoint = quic::bind_client(server)?;
        let conn = endpoint
            .connect_with(
                quic::client_config(&material)?,
                server,
                tls::MASTER_SERVER_NAME,
            )?
            .await
            .context("QUIC handshake with the echo server")?;
        let (send, recv) = conn.open_bi().await?;
        Ok(Self {
            conn,
            tx: FrameSender(send),
            rx: FrameReceiver(recv),
            seq: 0,
        })
    }

    /// One round trip.
    pub async fn ping(&mut self) -> anyhow::Result<Duration> {
        self.seq += 1;
        let t = Instant::now();
        self.tx.send(&self.seq).await?;
        let back: u64 = self.rx.recv().await?;
        anyhow::ensure!(back == self.seq, "echo out of order");
        Ok(t.elapsed())
    }

    /// `n` pings back to back into `out`.
    pub async fn burst(&mut self, n: usize, out: &Samples) -> anyhow::Result<()> {
        for _ in 0..n {
            out.record(self.ping().await?);
        }
        Ok(())
    }

    /// A ping every `every` until `stop` is set, into `out` (the floor under load).
    pub async fn paced(
        mut self,
        every: Duration,
        out: Arc<Samples>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            tick.tick().await;
            match self.ping().await {
                Ok(d) => out.record(d),
                Err(e) => {
                    tracing::warn!("floor ping: {e:#}");
                    break;
                }
            }
        }
        self.conn.close(0u32.into(), b"done");
    }
}
