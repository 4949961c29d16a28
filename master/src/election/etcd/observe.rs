//! Watching the election without campaigning: the observer task that reports the leader's
//! advertised address on every change ([`LeaderWatch`], [`read_leader`], [`current_leader`]),
//! for standbys, tools, agents and frameworks that can reach etcd.

use super::*;

/// Where an observer reports the leader it sees.
pub(crate) trait LeaderReport: Send + Sync + 'static {
    fn report(&self, leader: Option<String>);
    /// True when nobody listens any more (the observer then stops).
    fn closed(&self) -> bool;
}

impl LeaderReport for Sink {
    fn report(&self, leader: Option<String>) {
        self.leader_changed(leader);
    }
    fn closed(&self) -> bool {
        self.is_closed()
    }
}

impl LeaderReport for watch::Sender<Option<String>> {
    fn report(&self, leader: Option<String>) {
        self.send_if_modified(|cur| {
            if *cur == leader {
                false
            } else {
                *cur = leader;
                true
            }
        });
    }
    fn closed(&self) -> bool {
        self.is_closed()
    }
}

/// The observer task: reports the current leader's advertised address on every change.
pub(crate) async fn run_observer<R: LeaderReport>(cfg: EtcdElectionConfig, sink: R) {
    let prefix = format!("{}/", cfg.election_name());
    let mut backoff = TERM_BACKOFF_MIN;
    loop {
        if sink.closed() {
            return;
        }
        match connect(&cfg).await {
            Ok(client) => {
                let err = observe(&client, &prefix, &sink, &cfg).await;
                debug!("election observer: {err}");
                backoff = TERM_BACKOFF_MIN;
            }
            Err(e) => debug!("election observer: {e}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(TERM_BACKOFF_MAX);
    }
}

/// Follows the elected leader's advertised address without campaigning: for standbys' tools,
/// agents or frameworks that can reach etcd and want to find the leader. Stops when dropped.
pub struct LeaderWatch {
    rx: watch::Receiver<Option<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaderWatch {
    /// Starts watching the election of the cluster under `prefix` (e.g. `/gantry`). Must be
    /// called inside a Tokio runtime; connection problems are retried in the background.
    pub fn start(endpoints: Vec<String>, prefix: &str) -> LeaderWatch {
        let mut cfg = EtcdElectionConfig::new(endpoints, "");
        cfg.prefix = prefix.to_string();
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(run_observer(cfg, tx));
        LeaderWatch { rx, task }
    }

    /// The leader's advertised address as last seen (`None`: no leader, or not known yet).
    pub fn leader(&self) -> Option<String> {
        self.rx.borrow().clone()
    }

    /// A receiver that wakes on every leader change.
    pub fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.rx.clone()
    }
}

impl Drop for LeaderWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The leader under `prefix` (lowest create revision) and the revision of the read.
pub async fn read_leader(
    client: &Client,
    prefix: &str,
    timeout: Duration,
) -> Result<(Option<String>, i64), String> {
    let opts = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let resp = timed(timeout, client.kv_client().get(prefix, Some(opts))).await?;
    let leader = resp
        .kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
    let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
    Ok((leader, revision))
}

/// Reads the leader, then watches the election prefix and re-reads on every change, and at
/// least once per TTL (a stalled watch must not leave a stale answer forever). Returns why it
/// stopped.
pub(super) async fn observe<R: LeaderReport>(
    client: &Client,
    prefix: &str,
    sink: &R,
    cfg: &EtcdElectionConfig,
) -> String {
    let (leader, revision) = match read_leader(client, prefix, cfg.request_timeout).await {
        Ok(v) => v,
        Err(e) => return format!("reading the leader: {e}"),
    };
    sink.report(leader);
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision + 1);
    let mut stream = match timed(
        cfg.request_timeout,
        client.watch_client().watch(prefix, Some(opts)),
    )
    .await
    {
        Ok(s) => s,
        Err(e) => return format!("watching the election: {e}"),
    };
    loop {
        if sink.closed() {
            return "election ended".into();
        }
        tokio::select! {
            msg = stream.message() => match msg {
                Ok(Some(resp)) if resp.canceled() => {
                    return format!("watch cancelled: {}", resp.cancel_reason());
                }
                Ok(Some(resp)) if resp.events().is_empty() => continue,
                Ok(Some(_)) => {}
                Ok(None) => return "watch stream ended".into(),
                Err(e) => return format!("watch: {e}"),
            },
            _ = tokio::time::sleep(cfg.lease_ttl) => {}
        }
        match read_leader(client, prefix, cfg.request_timeout).await {
            Ok((leader, _)) => sink.report(leader),
            Err(e) => return format!("reading the leader: {e}"),
        }
    }
}

/// Reads the current leader's advertised address once (for tools and agents that only need a
/// one-shot answer).
pub async fn current_leader(cfg: &EtcdElectionConfig) -> Result<Option<String>, ElectionError> {
    let client = connect(cfg).await?;
    let prefix = format!("{}/", cfg.election_name());
    read_leader(&client, &prefix, cfg.request_timeout)
        .await
        .map(|(leader, _)| leader)
        .map_err(ElectionError::Etcd)
}
