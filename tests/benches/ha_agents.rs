//! Failover benchmark of the whole HA master with many agents over real QUIC.
//!
//! One round per agent count (default 1,000 and 10,000):
//!
//! 1. a real etcd (the harness's [`EtcdServer`]) and three real `gantry-master` processes
//!    (`--etcd`, `--lease-ttl $HA_BENCH_TTL`, default 3 s);
//! 2. N emulated agents in this process, each with its own certificate issued from the dev TLS
//!    directory (`agent:bench-N`), speaking the agent protocol with `gantry_sdk::transport` +
//!    `protocol` exactly as `gantry-agent` does: a link to every master
//!    (`gantry_sdk::transport::masters`, the same code and QUIC settings as the real agent:
//!    standbys keep the link open and announce their election on it), `Register` on the
//!    leader's stream, heartbeats at the master's interval, re-registration with its agent id
//!    when a new leader announces itself. Each agent has its own QUIC connections; they share a
//!    few client UDP sockets (`HA_BENCH_ENDPOINTS`, default 64);
//! 3. one SDK framework that keeps every offer it gets (so the master offers each agent once);
//! 4. `kill -9` the leader, then time
//!    - kill → the old leader key deleted in etcd (lease expiry; watched on the election prefix),
//!    - lease expiry → a standby says `leader` on `/health` (polled every 10 ms),
//!    - → the framework's first offer from the new leader ("serving offers"),
//!    - → the first and the last of the N agents `Registered` by the new leader (epoch higher
//!      than before the kill).
//!
//! Run (release; build the master first so the bench finds it next to itself):
//! ```text
//! cargo build --release -p gantry-master --bins
//! cargo bench -p gantry-tests --bench ha_agents
//! ```
//! Environment: `HA_BENCH_AGENTS` (default `1000,10000`), `HA_BENCH_TTL` (default 3),
//! `HA_BENCH_ENDPOINTS` (client UDP sockets, default 64).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use gantry_sdk::protocol::*;
use gantry_sdk::transport::masters::{LeaderSession, Masters, MastersConfig};
use gantry_tests::emu::{self, agent_configs, cpu_time};
use gantry_tests::etcd::EtcdServer;
use gantry_tests::{MasterProc, TempDir};
use tokio::sync::mpsc;

/// What an emulated agent reports.
enum AgentEvent {
    Registered {
        idx: usize,
        epoch: u64,
        at: Instant,
    },
    /// The connection to a master it was registered with ended.
    Lost {
        idx: usize,
        at: Instant,
    },
}

/// One emulated agent: links to every master, registers with the leader, heartbeats, and
/// switches to a newly elected leader, like `gantry-agent`.
async fn agent(
    idx: usize,
    endpoint: quinn::Endpoint,
    cfg: quinn::ClientConfig,
    masters: Vec<String>,
    events: mpsc::UnboundedSender<AgentEvent>,
) {
    let mut config = MastersConfig::new(masters, PeerKind::Agent, cfg);
    config.endpoint = Some(endpoint);
    let Ok(mut masters) = Masters::start(config) else {
        return;
    };
    let mut agent_id: Option<AgentId> = None;
    loop {
        let session = masters.next_session().await;
        let conn = session.conn.clone();
        let registered = agent_session(idx, session, &mut masters, &mut agent_id, &events).await;
        conn.close(0u32.into(), b"reconnecting");
        if registered {
            let _ = events.send(AgentEvent::Lost {
                idx,
                at: Instant::now(),
            });
        }
    }
}

/// One session with a leader, until it is lost or a newer leader announces itself. Returns
/// whether it registered.
async fn agent_session(
    idx: usize,
    session: LeaderSession,
    masters: &mut Masters,
    agent_id: &mut Option<AgentId>,
    events: &mpsc::UnboundedSender<AgentEvent>,
) -> bool {
    let LeaderSession { mut tx, mut rx, .. } = session;
    let resources: Resources = "cpus:8;mem:16384".parse().expect("literal");
    let register = AgentToMaster::Register {
        agent_id: *agent_id,
        hostname: format!("bench-{idx}.example"),
        resources,
        reserved: Default::default(),
        attributes: Default::default(),
        gpus: Vec::new(),
        running_tasks: Vec::new(),
        pending_updates: Vec::new(),
        task_user: "nobody".into(),
    };
    if tx.send(&register).await.is_err() {
        return false;
    }
    let mut beat = tokio::time::interval(Duration::from_secs(5));
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut registered = false;
    loop {
        tokio::select! {
            msg = rx.recv::<MasterToAgent>() => match msg {
                Ok(MasterToAgent::Registered { agent_id: id, epoch, heartbeat_interval_ms }) => {
                    *agent_id = Some(id);
                    registered = true;
                    beat = tokio::time::interval(Duration::from_millis(heartbeat_interval_ms.max(100)));
                    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    beat.reset();
                    let _ = events.send(AgentEvent::Registered { idx, epoch, at: Instant::now() });
                }
                Ok(MasterToAgent::Error { .. }) | Err(_) => return registered,
                Ok(_) => {}
            },
            _ = beat.tick(), if registered => {
                if tx.send(&AgentToMaster::Heartbeat).await.is_err() {
                    return registered;
                }
            }
            _ = masters.newer_leader() => return registered,
        }
    }
}

/// Holds every offer (so each agent is offered once) and records when offers arrive.
struct Holder {
    offers: Arc<Mutex<Vec<Instant>>>,
}

impl gantry_sdk::Scheduler for Holder {
    async fn offers(&mut self, _driver: &gantry_sdk::DriverHandle, _offers: Vec<Offer>) {
        self.offers.lock().expect("lock").push(Instant::now());
    }
}

fn health(m: &MasterProc) -> Option<serde_json::Value> {
    m.health().ok()
}

struct Figures {
    agents: usize,
    initial_registration: Duration,
    kill_to_expiry: Duration,
    expiry_to_leader: Duration,
    leader_to_offer: Duration,
    kill_to_first_agent: Duration,
    kill_to_all_agents: Duration,
    spread: Duration,
    /// Old lease expired -> the last agent re-registered with the new leader.
    expiry_to_all_agents: Duration,
    /// Per agent: connection lost -> re-registered with the new leader (p50, p99, max).
    rereg: (Duration, Duration, Duration),
    /// CPU used from the kill until all agents were back: the two remaining masters, and this
    /// process (the emulated agents and the framework).
    masters_cpu: Duration,
    bench_cpu: Duration,
}

/// Agents started at once during setup.
const WAVE: usize = 500;

fn ms(d: Duration) -> String {
    format!("{:>6.0}", d.as_secs_f64() * 1000.0)
}

async fn round(n: usize, ttl: u64, endpoints: usize) -> anyhow::Result<Figures> {
    let etcd = tokio::task::block_in_place(EtcdServer::start)?;
    let dir = TempDir::new("gantry-ha-bench")?;
    let tls_dir = dir.path().join("tls");
    let ttl_s = ttl.to_string();
    let args = [
        "--etcd",
        &etcd.client_url(),
        "--lease-ttl",
        &ttl_s,
        "--agent-reregister-timeout",
        "60",
        // Every emulated agent connects from 127.0.0.1.
        "--max-connections-per-address",
        "0",
    ];
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(tokio::task::block_in_place(|| {
            MasterProc::start(dir.path(), &tls_dir, &args)
        })?);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let leader = loop {
        if let Some(i) = masters.iter().position(|m| m.is_leader()) {
            break i;
        }
        if Instant::now() > deadline {
            bail!("no leader elected");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let addrs: Vec<String> = masters.iter().map(|m| m.quic.to_string()).collect();

    let t = Instant::now();
    let configs = tokio::task::block_in_place(|| agent_configs(&tls_dir, "bench", n))?;
    eprintln!("  {n} agent certificates in {:?}", t.elapsed());

    // The framework.
    let offers = Arc::new(Mutex::new(Vec::new()));
    let fw = {
        let config = gantry_sdk::DriverConfig::new(
            addrs.clone(),
            tls_dir.clone(),
            "bench-fw",
            vec!["bench".into()],
        );
        let driver = gantry_sdk::Driver::new(config);
        let holder = Holder {
            offers: offers.clone(),
        };
        tokio::spawn(driver.run(holder))
    };

    // The agents, spread over a few client endpoints (UDP sockets).
    let eps: Vec<quinn::Endpoint> = (0..endpoints)
        .map(|_| emu::client_endpoint())
        .collect::<anyhow::Result<_>>()?;
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let start = Instant::now();
    // Start the agents in waves (setup only: a real cluster does not boot 10,000 agents in the
    // same second); the failover below is the herd we measure.
    let mut tasks = Vec::with_capacity(n);
    let mut configs = configs.into_iter().enumerate();
    let mut epoch_of = vec![0u64; n];
    let mut registered = 0;
    while registered < n {
        if tasks.len() < n && tasks.len() < registered + WAVE {
            for (i, cfg) in configs.by_ref().take(WAVE) {
                tasks.push(tokio::spawn(agent(
                    i,
                    eps[i % eps.len()].clone(),
                    cfg,
                    addrs.clone(),
                    ev_tx.clone(),
                )));
            }
        }
        let AgentEvent::Registered { idx, epoch, .. } =
            tokio::time::timeout(Duration::from_secs(120), ev_rx.recv())
                .await
                .context("agents did not all register within 120 s")?
                .context("agents ended")?
        else {
            continue;
        };
        if epoch_of[idx] == 0 {
            registered += 1;
        }
        epoch_of[idx] = epoch;
    }
    let initial_registration = start.elapsed();
    eprintln!("  {n} agents registered in {initial_registration:?}");
    let old_epoch = *epoch_of.iter().max().unwrap_or(&0);
    // Let the registry writes and first offers settle, then measure the steady-state cost of
    // N connected agents (keep-alives, heartbeats, standby links).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all_pids: Vec<String> = masters.iter().map(|m| m.proc.pid().to_string()).collect();
    let (m0, e0) = (
        all_pids.iter().map(|p| cpu_time(p)).sum::<Duration>(),
        cpu_time("self"),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_masters = (all_pids.iter().map(|p| cpu_time(p)).sum::<Duration>() - m0) / 5;
    let idle_emulator = (cpu_time("self") - e0) / 5;
    eprintln!(
        "  steady state with {n} agents: masters {:.0} ms CPU/s (all three), emulator {:.0} ms CPU/s",
        idle_masters.as_secs_f64() * 1000.0,
        idle_emulator.as_secs_f64() * 1000.0
    );

    // Watch the election for the old leader key's deletion.
    let client = etcd_client::Client::connect([etcd.client_url()], None).await?;
    let (expired_tx, expired_rx) = tokio::sync::oneshot::channel::<Instant>();
    let mut watch = client
        .watch_client()
        .watch(
            "/gantry/leader/",
            Some(etcd_client::WatchOptions::new().with_prefix()),
        )
        .await?;
    tokio::spawn(async move {
        while let Ok(Some(resp)) = watch.message().await {
            if resp
                .events()
                .iter()
                .any(|e| e.event_type() == etcd_client::EventType::Delete)
            {
                let _ = expired_tx.send(Instant::now());
                return;
            }
        }
    });

    // kill -9 the leader.
    let others_pids: Vec<String> = (0..3)
        .filter(|i| *i != leader)
        .map(|i| masters[i].proc.pid().to_string())
        .collect();
    let cpu_before: Vec<Duration> = others_pids.iter().map(|p| cpu_time(p)).collect();
    let self_before = cpu_time("self");
    let killed = Instant::now();
    masters[leader].proc.kill9();
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let new_leader_at = loop {
        if others
            .iter()
            .any(|i| health(&masters[*i]).is_some_and(|h| h["role"] == "leader"))
        {
            break Instant::now();
        }
        if killed.elapsed() > Duration::from_secs(30) {
            bail!("no new leader within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let mut first_agent = None;
    let mut back = 0;
    let mut lost_at: Vec<Option<Instant>> = vec![None; n];
    let mut latencies = Vec::with_capacity(n);
    while back < n {
        let ev = tokio::time::timeout(Duration::from_secs(60), ev_rx.recv())
            .await
            .with_context(|| format!("only {back} of {n} agents re-registered within 60 s"))?
            .context("agents ended")?;
        match ev {
            AgentEvent::Lost { idx, at } => {
                if lost_at[idx].is_none() && epoch_of[idx] <= old_epoch {
                    lost_at[idx] = Some(at);
                }
            }
            AgentEvent::Registered { idx, epoch, at } => {
                if epoch > old_epoch && epoch_of[idx] <= old_epoch {
                    back += 1;
                    first_agent.get_or_insert(at);
                    if let Some(l) = lost_at[idx] {
                        latencies.push(at - l);
                    }
                }
                epoch_of[idx] = epoch_of[idx].max(epoch);
            }
        }
    }
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let all_agents = Instant::now();
    let masters_cpu: Duration = others_pids
        .iter()
        .zip(&cpu_before)
        .map(|(p, b)| cpu_time(p).saturating_sub(*b))
        .sum();
    let bench_cpu = cpu_time("self").saturating_sub(self_before);
    let expired_at = tokio::time::timeout(Duration::from_secs(1), expired_rx)
        .await
        .context("no delete of the leader key seen")??;
    // The framework may come back after the last agent: wait for its first offer.
    let offer_deadline = Instant::now() + Duration::from_secs(30);
    let first_offer = loop {
        let first = offers
            .lock()
            .expect("lock")
            .iter()
            .copied()
            .find(|t| *t > killed);
        match first {
            Some(t) => break t,
            None if Instant::now() > offer_deadline => {
                bail!("no offer within 30 s after the failover")
            }
            None => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    let first_agent = first_agent.unwrap_or(all_agents);

    for t in tasks {
        t.abort();
    }
    fw.abort();
    for ep in &eps {
        ep.close(0u32.into(), b"bench done");
    }
    drop(masters);
    drop(etcd);
    Ok(Figures {
        agents: n,
        initial_registration,
        kill_to_expiry: expired_at - killed,
        expiry_to_leader: new_leader_at.saturating_duration_since(expired_at),
        leader_to_offer: first_offer.saturating_duration_since(new_leader_at),
        kill_to_first_agent: first_agent - killed,
        kill_to_all_agents: all_agents - killed,
        spread: all_agents - first_agent,
        expiry_to_all_agents: all_agents.saturating_duration_since(expired_at),
        rereg: (
            pct(0.5),
            pct(0.99),
            latencies.last().copied().unwrap_or_default(),
        ),
        masters_cpu,
        bench_cpu,
    })
}

fn main() -> anyhow::Result<()> {
    let counts: Vec<usize> = std::env::var("HA_BENCH_AGENTS")
        .unwrap_or_else(|_| "1000,10000".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()
        .context("HA_BENCH_AGENTS: comma-separated agent counts")?;
    let ttl: u64 = std::env::var("HA_BENCH_TTL")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let endpoints: usize = std::env::var("HA_BENCH_ENDPOINTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(64)
        .max(1);

    // Peers' warnings (lost links, refused subscriptions) go to stderr.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("info,quinn=warn,quinn_proto=warn")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "HA failover, 3 masters on etcd, lease TTL {ttl} s, agents over QUIC (ms)\n\
         {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "agents",
        "initreg",
        "kill>exp",
        "exp>lead",
        "lead>off",
        "kill>1st",
        "kill>all",
        "spread",
        "exp>all",
        "rr p50",
        "rr p99",
        "rr max",
        "cpu mst",
        "cpu emu"
    );
    let mut failed = None;
    for n in counts {
        eprintln!("round: {n} agents, lease TTL {ttl} s");
        // Print each row as soon as it is measured; a failed round does not hide the others.
        let f = match rt.block_on(round(n, ttl, endpoints)) {
            Ok(f) => f,
            Err(e) => {
                println!("{n:>7} failed: {e:#}");
                failed = Some(e);
                continue;
            }
        };
        println!(
            "{:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            f.agents,
            ms(f.initial_registration),
            ms(f.kill_to_expiry),
            ms(f.expiry_to_leader),
            ms(f.leader_to_offer),
            ms(f.kill_to_first_agent),
            ms(f.kill_to_all_agents),
            ms(f.spread),
            ms(f.expiry_to_all_agents),
            ms(f.rereg.0),
            ms(f.rereg.1),
            ms(f.rereg.2),
            ms(f.masters_cpu),
            ms(f.bench_cpu),
        );
    }
    println!(
        "initreg: first registration of all agents; kill>exp: kill -9 -> old lease expired \
         (leader key deleted); exp>lead: -> a standby leads (/health); lead>off: -> the \
         framework's first offer; kill>1st / kill>all: -> first / last agent re-registered; \
         spread: first -> last agent re-registered; exp>all: old lease expired -> last agent \
         re-registered; rr p50/p99/max: per agent, left the old leader -> re-registered; \
         cpu mst / cpu emu: CPU time used from the kill to the last re-registration by the two \
         remaining masters / by this process (emulated agents + framework)"
    );
    failed.map_or(Ok(()), Err)
}
