//! The agent's connection to the leading master: connect with mutual TLS, hand the core loop
//! an outbox, forward master messages to it, follow leader redirects, reconnect with backoff.

use std::time::Duration;

use gantry_sdk::protocol::*;
use gantry_sdk::transport::backoff::Backoff;
use gantry_sdk::transport::candidates::MasterCandidates;
use gantry_sdk::transport::{quic, TlsMaterial};
use tokio::sync::mpsc;

use crate::agent::{AgentConfig, Event};

/// Runs until the core loop goes away.
pub(crate) async fn run(
    config: AgentConfig,
    material: TlsMaterial,
    events: mpsc::UnboundedSender<Event>,
) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut candidates = MasterCandidates::new(config.masters.clone());
    loop {
        let Some(target) = candidates.next_target() else {
            return;
        };
        let addr = match tokio::net::lookup_host(&target)
            .await
            .ok()
            .and_then(|mut a| a.next())
        {
            Some(a) => a,
            None => {
                tracing::warn!("cannot resolve master address {target:?}");
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        };
        let endpoint = match quic::client_endpoint(&material, addr) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!("QUIC endpoint: {e}");
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        };
        match quic::connect(&endpoint, addr, PeerKind::Agent).await {
            Ok((conn, mut tx, mut rx)) => {
                tracing::info!(master = %addr, "connected to master");
                let (out_tx, mut out_rx) = mpsc::unbounded_channel::<AgentToMaster>();
                if events.send(Event::Connected(out_tx)).is_err() {
                    return;
                }
                let writer = tokio::spawn(async move {
                    while let Some(m) = out_rx.recv().await {
                        if tx.send(&m).await.is_err() {
                            break;
                        }
                    }
                });
                let mut redirect = None;
                loop {
                    match rx.recv::<MasterToAgent>().await {
                        Ok(MasterToAgent::NotLeader { leader }) => {
                            redirect = Some(leader);
                            break;
                        }
                        Ok(msg) => {
                            if matches!(msg, MasterToAgent::Registered { .. }) {
                                backoff.reset();
                                candidates.connected();
                            }
                            if events.send(Event::Master(msg)).is_err() {
                                writer.abort();
                                return;
                            }
                        }
                        Err(e) => {
                            tracing::warn!("master connection lost: {e}");
                            break;
                        }
                    }
                }
                writer.abort();
                conn.close(0u32.into(), b"reconnecting");
                if events.send(Event::Disconnected).is_err() {
                    return;
                }
                match redirect {
                    Some(leader) => {
                        tracing::info!(?leader, "redirected to the leading master");
                        if candidates.redirect(leader.as_deref()) {
                            continue;
                        }
                    }
                    None => candidates.lost(&target),
                }
            }
            Err(e) => {
                tracing::warn!("connecting to master {target}: {e}");
                candidates.lost(&target);
            }
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}
