//! Leader election with etcd's election API on a lease (the I/O shell around [`super::lease`]).
//!
//! One *term* = one lease: grant a lease of `lease_ttl`, keep it alive, campaign on
//! `{prefix}/leader` with the advertised address as value, lead until the lease cannot be kept,
//! then start a new term with a new lease. Details that matter:
//!
//! - **Step down before etcd can elect another.** The keep-alive loop sends one request at a time
//!   and moves the local deadline to `send time + TTL - margin` on each successful answer
//!   ([`super::lease::LeaseDeadline`]). When the deadline passes the leader emits `Lost` at once,
//!   even if etcd is unreachable: etcd cannot have expired the lease yet, so no other master can
//!   have won.
//! - **Keeper recreated.** With etcd 3.4 a keep-alive stream dies for good when etcd restarts;
//!   the loop opens a new stream whenever one fails or stalls.
//! - **Campaign never cancelled by a request timeout.** The election client has no request
//!   timeout (etcd-client's timeout would cancel the blocking campaign); unary requests get their
//!   own `tokio::time::timeout`, and the campaign is abandoned only when the lease is lost.
//! - **Verified win.** After the campaign returns, the leader key is read back and must still
//!   carry this term's lease and create revision before `Elected` is emitted.
//! - **Stale lease revoked.** A term that ends keeps its lease id; the next term revokes it first
//!   (when etcd is reachable again) so this master's old candidate key does not block the
//!   election until the TTL runs out (etcd restores leases with a full TTL after a restart).
//!   A master that resigns between terms (the server stops after `Lost`) keeps retrying that
//!   revoke until etcd answers or the resign times out.
//! - **Previous incarnation released.** Before its first term a master revokes the leases of
//!   candidate keys carrying its own advertised address: they are its previous process's (killed,
//!   or stopped while etcd was down), whose leader key would otherwise hold the election up for a
//!   TTL. `--advertise` must therefore be unique per master.
//! - **Retried at once.** Between failed terms (etcd unreachable) the pause grows to at most
//!   `TERM_BACKOFF_MAX` (500 ms), so a campaign starts within that of etcd serving again.
//! - **Epoch** = the leader key's create revision: etcd revisions only grow, so every new term's
//!   epoch is greater than all earlier ones.
//!
//! A separate observer task reads the leader (the candidate key with the lowest create revision
//! under `{prefix}/leader/`, as etcd's election defines it) and watches for changes; it reports
//! `LeaderChanged` with the leader's advertised address.

use std::time::{Duration, Instant};

use etcd_client::{
    Client, ConnectOptions, GetOptions, LeaderKey, ResignOptions, SortOrder, SortTarget,
    WatchOptions,
};
use tokio::sync::{oneshot, watch};
use tracing::{debug, info, warn};

use super::lease::{default_margin, keepalive_interval, LeaseDeadline};
use super::{ElectionError, Fence, Sink};

/// Pause before retrying a failed keep-alive stream.
const KEEPER_RETRY: Duration = Duration::from_millis(100);
/// Bounds of the pause between failed terms (and observer reconnections): small, so a campaign
/// starts at once when etcd serves again; a refused connection costs next to nothing.
const TERM_BACKOFF_MIN: Duration = Duration::from_millis(100);
const TERM_BACKOFF_MAX: Duration = Duration::from_millis(500);

/// Configuration of an etcd-backed election.
#[derive(Debug, Clone)]
pub struct EtcdElectionConfig {
    /// etcd client URLs, e.g. `http://10.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// The address agents and frameworks should use for this master (stored as the candidate's
    /// value, read by standbys to redirect).
    pub advertise: String,
    /// Key prefix of this cluster in etcd (election at `{prefix}/leader`, registry at
    /// `{prefix}/registry/`). Default `/gantry`.
    pub prefix: String,
    /// Lease TTL; etcd counts whole seconds (rounded up) and may raise it to its minimum.
    /// Default 3 s.
    pub lease_ttl: Duration,
    /// How long before the lease could expire in etcd the leader steps down. Default: a quarter
    /// of the TTL, at least 250 ms.
    pub step_down_margin: Option<Duration>,
    /// Timeout of each unary etcd request (grant, keep-alive answer, get, resign). Default 1 s.
    pub request_timeout: Duration,
    /// Timeout for establishing a connection. Default 2 s.
    pub connect_timeout: Duration,
}

impl EtcdElectionConfig {
    /// A configuration with the defaults above.
    pub fn new(endpoints: Vec<String>, advertise: impl Into<String>) -> Self {
        EtcdElectionConfig {
            endpoints,
            advertise: advertise.into(),
            prefix: "/gantry".into(),
            lease_ttl: Duration::from_secs(3),
            step_down_margin: None,
            request_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(2),
        }
    }

    /// Parses `--etcd URL[,URL...]`; a bare `host:port` gets `http://`.
    pub fn parse_endpoints(list: &str) -> Result<Vec<String>, ElectionError> {
        let eps: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                if s.contains("://") {
                    s.to_string()
                } else {
                    format!("http://{s}")
                }
            })
            .collect();
        if eps.is_empty() {
            return Err(ElectionError::Config("--etcd lists no endpoint".into()));
        }
        Ok(eps)
    }

    /// The election name: `{prefix}/leader`.
    pub fn election_name(&self) -> String {
        format!("{}/leader", self.prefix.trim_end_matches('/'))
    }

    /// The TTL requested from etcd, in whole seconds.
    pub fn ttl_secs(&self) -> i64 {
        (self.lease_ttl.as_millis().div_ceil(1000) as i64).max(1)
    }

    /// The effective step-down margin.
    pub fn margin(&self) -> Duration {
        self.step_down_margin
            .unwrap_or_else(|| default_margin(self.lease_ttl))
    }

    pub(crate) fn validate(&self) -> Result<(), ElectionError> {
        if self.endpoints.is_empty() {
            return Err(ElectionError::Config("no etcd endpoint given".into()));
        }
        if self.advertise.trim().is_empty() {
            return Err(ElectionError::Config(
                "--advertise is required with --etcd (the address standbys redirect to)".into(),
            ));
        }
        if self.lease_ttl < Duration::from_secs(1) {
            return Err(ElectionError::Config(format!(
                "lease TTL {:?} is below etcd's 1 s granularity",
                self.lease_ttl
            )));
        }
        if self.margin() >= self.lease_ttl {
            return Err(ElectionError::Config(format!(
                "step-down margin {:?} must be shorter than the lease TTL {:?}",
                self.margin(),
                self.lease_ttl
            )));
        }
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(ElectionError::Config("zero etcd timeout".into()));
        }
        Ok(())
    }
}

/// A client without request timeout (a timeout would cancel a blocking campaign or watch).
pub(crate) async fn connect(cfg: &EtcdElectionConfig) -> Result<Client, ElectionError> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(cfg.connect_timeout)
        // HTTP/2 pings find dead connections; etcd refuses pings more often than every 5 s.
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
        // Refuse service from an etcd member cut off from its own quorum.
        .with_require_leader(true);
    match tokio::time::timeout(
        cfg.connect_timeout,
        Client::connect(&cfg.endpoints, Some(opts)),
    )
    .await
    {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(ElectionError::Etcd(format!(
            "connecting to {:?} timed out",
            cfg.endpoints
        ))),
    }
}

/// Runs `fut` with the request timeout, flattening both failure kinds into a message.
async fn timed<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("timed out after {limit:?}")),
    }
}

/// The keep-alive loop's view of the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeepState {
    Alive(LeaseDeadline),
    /// etcd answered that the lease no longer exists.
    Gone,
}

/// How a term ended.
enum TermEnd {
    Resigned,
    Failed { lease: Option<i64>, reason: String },
}

/// The campaign task: terms, one after the other, until resigned.
pub(crate) async fn run_campaign(
    cfg: EtcdElectionConfig,
    sink: Sink,
    mut resign: oneshot::Receiver<()>,
) {
    let mut stale_lease: Option<i64> = None;
    let mut previous_released = false;
    let mut backoff = TERM_BACKOFF_MIN;
    loop {
        if sink.is_closed() {
            return;
        }
        let client = match connect(&cfg).await {
            Ok(c) => c,
            Err(e) => {
                warn!("election: cannot connect to etcd: {e}");
                if wait_or_resign(backoff, &mut resign).await {
                    release(&cfg, stale_lease).await;
                    return;
                }
                backoff = (backoff * 2).min(TERM_BACKOFF_MAX);
                continue;
            }
        };
        if !previous_released {
            match release_previous(&cfg, &client).await {
                Ok(()) => previous_released = true,
                Err(e) => {
                    warn!("election: cannot read the election: {e}");
                    if wait_or_resign(backoff, &mut resign).await {
                        return;
                    }
                    backoff = (backoff * 2).min(TERM_BACKOFF_MAX);
                    continue;
                }
            }
        }
        if let Some(id) = stale_lease {
            // Best effort: frees this master's old candidate key at once.
            match timed(cfg.request_timeout, client.lease_client().revoke(id)).await {
                Ok(_) => {
                    debug!("election: revoked stale lease {id:x}");
                    stale_lease = None;
                }
                Err(e) if e.contains("not found") => stale_lease = None,
                Err(e) => debug!("election: revoking stale lease {id:x}: {e}"),
            }
        }
        match run_term(&cfg, &client, &sink, &mut resign).await {
            TermEnd::Resigned => return,
            TermEnd::Failed { lease, reason } => {
                warn!("election: term ended: {reason}");
                if lease.is_some() {
                    // etcd answered this term: retry soon (a failover must not wait on an
                    // old backoff); only unreachable etcd makes the pause grow.
                    stale_lease = lease;
                    backoff = TERM_BACKOFF_MIN;
                }
                if let Some(id) = stale_lease {
                    if timed(cfg.request_timeout, client.lease_client().revoke(id))
                        .await
                        .is_ok()
                    {
                        stale_lease = None;
                    }
                }
                if wait_or_resign(backoff, &mut resign).await {
                    release(&cfg, stale_lease).await;
                    return;
                }
                backoff = (backoff * 2).min(TERM_BACKOFF_MAX);
            }
        }
    }
}

/// Pause between attempts to revoke a lease while resigning.
const RELEASE_RETRY: Duration = Duration::from_millis(100);

/// Resigning between terms: revokes `lease` (the last term's, not yet revoked because etcd did
/// not answer), retrying until etcd answers. The caller bounds the wait ([`super::Election::resign`]).
async fn release(cfg: &EtcdElectionConfig, lease: Option<i64>) {
    let Some(id) = lease else { return };
    loop {
        if let Ok(client) = connect(cfg).await {
            match timed(cfg.request_timeout, client.lease_client().revoke(id)).await {
                Ok(_) => {
                    info!("election: released lease {id:x} of the last term");
                    return;
                }
                Err(e) if e.contains("not found") => return,
                Err(e) => debug!("election: releasing lease {id:x}: {e}"),
            }
        }
        tokio::time::sleep(RELEASE_RETRY).await;
    }
}

/// Revokes the leases of candidate keys carrying this master's advertised address: before its
/// first term a master has none, so they are a previous incarnation's (killed, or stopped while
/// etcd was down). Its key, the leader's perhaps, would hold the election up for a TTL.
async fn release_previous(cfg: &EtcdElectionConfig, client: &Client) -> Result<(), String> {
    let prefix = format!("{}/", cfg.election_name());
    let resp = timed(
        cfg.request_timeout,
        client
            .kv_client()
            .get(prefix, Some(GetOptions::new().with_prefix())),
    )
    .await?;
    for kv in resp.kvs() {
        if kv.value() != cfg.advertise.as_bytes() || kv.lease() == 0 {
            continue;
        }
        let id = kv.lease();
        match timed(cfg.request_timeout, client.lease_client().revoke(id)).await {
            Ok(_) => info!(
                "election: released lease {id:x} of this master's previous process (its candidate key {})",
                String::from_utf8_lossy(kv.key())
            ),
            Err(e) if e.contains("not found") => {}
            Err(e) => return Err(format!("revoking lease {id:x}: {e}")),
        }
    }
    Ok(())
}

/// Sleeps `d`; true if a resignation (or the election's end) arrived meanwhile.
async fn wait_or_resign(d: Duration, resign: &mut oneshot::Receiver<()>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = resign => true,
    }
}

/// Resolves when the lease must be considered lost, with the reason.
async fn lease_lost(state: &mut watch::Receiver<KeepState>) -> String {
    loop {
        let current = *state.borrow_and_update();
        match current {
            KeepState::Gone => return "etcd reports the lease gone (keep-alive TTL 0)".into(),
            KeepState::Alive(deadline) => {
                if deadline.expired(Instant::now()) {
                    return "lease not renewed in time (keep-alive deadline passed)".into();
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline.deadline().into()) => {}
                    changed = state.changed() => {
                        if changed.is_err() {
                            // The keep-alive task ended without reporting Gone: treat the
                            // last deadline as final.
                            tokio::time::sleep_until(deadline.deadline().into()).await;
                            return "keep-alive loop ended".into();
                        }
                    }
                }
            }
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn run_term(
    cfg: &EtcdElectionConfig,
    client: &Client,
    sink: &Sink,
    resign: &mut oneshot::Receiver<()>,
) -> TermEnd {
    let margin = cfg.margin();
    let sent = Instant::now();
    let grant = match timed(
        cfg.request_timeout,
        client.lease_client().grant(cfg.ttl_secs(), None),
    )
    .await
    {
        Ok(g) => g,
        Err(e) => {
            return TermEnd::Failed {
                lease: None,
                reason: format!("lease grant: {e}"),
            }
        }
    };
    let lease_id = grant.id();
    if grant.ttl() <= 0 {
        return TermEnd::Failed {
            lease: Some(lease_id),
            reason: format!("lease grant answered TTL {}", grant.ttl()),
        };
    }
    let granted = Duration::from_secs(grant.ttl() as u64);
    let initial = LeaseDeadline::granted(sent, granted, margin);
    sink.new_lease(initial.deadline());
    let (state_tx, mut state_rx) = watch::channel(KeepState::Alive(initial));
    let _keeper = AbortOnDrop(tokio::spawn(keep_alive_loop(
        client.clone(),
        sink.clone(),
        LeaseSpec {
            id: lease_id,
            granted,
            initial,
            request_timeout: cfg.request_timeout,
            interval: keepalive_interval(granted, margin),
        },
        state_tx,
    )));
    debug!("election: lease {lease_id:x} granted for {granted:?}; campaigning");

    // Campaign (blocks while another master leads).
    let mut election = client.election_client();
    let leader_key = {
        let campaign = election.campaign(cfg.election_name(), cfg.advertise.clone(), lease_id);
        tokio::pin!(campaign);
        tokio::select! {
            res = &mut campaign => match res {
                Ok(mut resp) => match resp.take_leader() {
                    Some(k) => k,
                    None => return TermEnd::Failed {
                        lease: Some(lease_id),
                        reason: "campaign answered without a leader key".into(),
                    },
                },
                Err(e) => return TermEnd::Failed {
                    lease: Some(lease_id),
                    reason: format!("campaign: {e}"),
                },
            },
            reason = lease_lost(&mut state_rx) => return TermEnd::Failed {
                lease: Some(lease_id),
                reason: format!("while campaigning: {reason}"),
            },
            _ = &mut *resign => {
                let _ = timed(cfg.request_timeout, client.lease_client().revoke(lease_id)).await;
                return TermEnd::Resigned;
            }
        }
    };

    // Verify the win: our key, our lease, and the lease still valid locally.
    match timed(
        cfg.request_timeout,
        client.kv_client().get(leader_key.key().to_vec(), None),
    )
    .await
    {
        Ok(resp) => {
            let ours = resp.kvs().first().is_some_and(|kv| {
                kv.create_revision() == leader_key.rev() && kv.lease() == lease_id
            });
            if !ours {
                return TermEnd::Failed {
                    lease: Some(lease_id),
                    reason: "campaign returned but the leader key is gone".into(),
                };
            }
        }
        Err(e) => {
            return TermEnd::Failed {
                lease: Some(lease_id),
                reason: format!("verifying the leader key: {e}"),
            }
        }
    }
    if let KeepState::Alive(d) = *state_rx.borrow() {
        if d.expired(Instant::now()) {
            return TermEnd::Failed {
                lease: Some(lease_id),
                reason: "lease deadline passed while confirming the win".into(),
            };
        }
    } else {
        return TermEnd::Failed {
            lease: Some(lease_id),
            reason: "lease gone while confirming the win".into(),
        };
    }

    let epoch = leader_key.rev().max(0) as u64;
    let fence = Fence::Etcd {
        leader_key: leader_key.key().to_vec(),
        create_revision: leader_key.rev(),
        lease: lease_id,
    };
    info!(
        "election: elected leader at {} with epoch {epoch}",
        cfg.advertise
    );
    sink.elected(epoch, fence);

    // Lead until the lease is lost, the key disappears, or we resign.
    let (gone_tx, mut gone_rx) = oneshot::channel();
    let _checker = AbortOnDrop(tokio::spawn(watch_own_key(
        client.clone(),
        leader_key.clone(),
        cfg.request_timeout,
        keepalive_interval(granted, margin),
        gone_tx,
    )));
    tokio::select! {
        reason = lease_lost(&mut state_rx) => {
            sink.lost(reason.clone());
            TermEnd::Failed { lease: Some(lease_id), reason }
        }
        _ = &mut gone_rx => {
            let reason = "the leader key was deleted from etcd".to_string();
            sink.lost(reason.clone());
            TermEnd::Failed { lease: Some(lease_id), reason }
        }
        _ = &mut *resign => {
            // Stop acting first, then let a standby in at once.
            sink.lost("resigned".into());
            let opts = ResignOptions::new().with_leader(leader_key);
            if let Err(e) = timed(cfg.request_timeout, election.resign(Some(opts))).await {
                debug!("election: resign: {e}");
            }
            if let Err(e) = timed(cfg.request_timeout, client.lease_client().revoke(lease_id)).await {
                debug!("election: revoke on resign: {e}");
            }
            TermEnd::Resigned
        }
    }
}

/// One lease as the keep-alive loop needs it.
struct LeaseSpec {
    id: i64,
    granted: Duration,
    initial: LeaseDeadline,
    request_timeout: Duration,
    interval: Duration,
}

/// Keeps the lease alive, one request at a time, publishing the local deadline.
async fn keep_alive_loop(
    client: Client,
    sink: Sink,
    lease: LeaseSpec,
    state: watch::Sender<KeepState>,
) {
    let LeaseSpec {
        id: lease_id,
        granted,
        initial: mut deadline,
        request_timeout,
        interval,
    } = lease;
    let mut leases = client.lease_client();
    'stream: loop {
        // Opening the stream sends a first keep-alive and waits for its answer.
        let sent = Instant::now();
        let (mut keeper, mut stream) =
            match tokio::time::timeout(request_timeout, leases.keep_alive(lease_id)).await {
                Ok(Ok((keeper, stream))) => (keeper, stream),
                Ok(Err(e)) => {
                    let text = e.to_string();
                    if text.contains("lease not found")
                        || text.contains("requested lease not found")
                    {
                        let _ = state.send(KeepState::Gone);
                        return;
                    }
                    debug!("election: keep-alive stream for {lease_id:x}: {text}");
                    tokio::time::sleep(KEEPER_RETRY).await;
                    continue 'stream;
                }
                Err(_) => {
                    debug!("election: keep-alive stream for {lease_id:x} timed out");
                    continue 'stream;
                }
            };
        // The first answer (consumed inside `keep_alive`) renewed the lease to its full TTL.
        deadline.renewed(sent, granted);
        sink.renewed(deadline.deadline());
        if state.send(KeepState::Alive(deadline)).is_err() {
            return;
        }
        loop {
            tokio::time::sleep(interval).await;
            let sent = Instant::now();
            if let Err(e) = keeper.keep_alive().await {
                debug!("election: keep-alive send for {lease_id:x} failed ({e}); recreating");
                tokio::time::sleep(KEEPER_RETRY).await;
                continue 'stream;
            }
            match tokio::time::timeout(request_timeout, stream.message()).await {
                Ok(Ok(Some(resp))) => {
                    if resp.ttl() <= 0 {
                        let _ = state.send(KeepState::Gone);
                        return;
                    }
                    deadline.renewed(sent, Duration::from_secs(resp.ttl() as u64));
                    sink.renewed(deadline.deadline());
                    if state.send(KeepState::Alive(deadline)).is_err() {
                        return;
                    }
                }
                other => {
                    // Stream ended, failed or stalled (etcd 3.4 after a restart): a new one.
                    let why = match other {
                        Ok(Ok(_)) => "stream ended".to_string(),
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => format!("no answer within {request_timeout:?}"),
                    };
                    debug!(
                        "election: keep-alive stream for {lease_id:x} failed ({why}); recreating"
                    );
                    tokio::time::sleep(KEEPER_RETRY).await;
                    continue 'stream;
                }
            }
        }
    }
}

/// Polls the leader key; fires `gone` when etcd definitively answers that it no longer exists
/// with our create revision (deleted by an operator, or the lease revoked). Unreachability is not
/// "gone": the lease deadline covers that.
async fn watch_own_key(
    client: Client,
    key: LeaderKey,
    request_timeout: Duration,
    interval: Duration,
    gone: oneshot::Sender<()>,
) {
    let mut kv = client.kv_client();
    loop {
        tokio::time::sleep(interval).await;
        if let Ok(resp) = timed(request_timeout, kv.get(key.key().to_vec(), None)).await {
            let ours = resp
                .kvs()
                .first()
                .is_some_and(|kv| kv.create_revision() == key.rev());
            if !ours {
                let _ = gone.send(());
                return;
            }
        }
    }
}

mod observe;
pub(crate) use observe::run_observer;
pub use observe::{current_leader, read_leader, LeaderWatch};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_defaults() {
        let eps = EtcdElectionConfig::parse_endpoints("10.0.0.1:2379, https://e2:2379,").unwrap();
        assert_eq!(eps, vec!["http://10.0.0.1:2379", "https://e2:2379"]);
        assert!(EtcdElectionConfig::parse_endpoints(" , ").is_err());
        let cfg = EtcdElectionConfig::new(eps, "m1:5050");
        assert_eq!(cfg.election_name(), "/gantry/leader");
        assert_eq!(cfg.ttl_secs(), 3);
        assert_eq!(cfg.margin(), Duration::from_millis(750));
        cfg.validate().unwrap();
        let mut bad = cfg.clone();
        bad.advertise = " ".into();
        assert!(bad.validate().is_err());
        let mut bad = cfg.clone();
        bad.step_down_margin = Some(Duration::from_secs(3));
        assert!(bad.validate().is_err());
        let mut odd = cfg;
        odd.lease_ttl = Duration::from_millis(2100);
        assert_eq!(odd.ttl_secs(), 3);
    }
}
