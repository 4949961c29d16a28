//! The floor: the round trip of a bare QUIC ping over the same loopback with the same TLS as
//! the master's peers (the master's certificate on the server side, a framework certificate on
//! the client side, [`quic::server_endpoint`] / [`quic::client_config`] and the codec's frames),
//! with nothing of the master in between.

use std::net::SocketAddr;
use std::path::Path;
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
