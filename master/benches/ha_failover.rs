//! Failover benchmark of the HA building blocks against a real etcd (started by the test
//! harness): three campaigning masters, the leader is killed (its election dropped without
//! resigning, as `kill -9` would), and we measure
//!
//! - kill → etcd deletes the old leader key (lease expiry; bounded by the TTL),
//! - old lease expiry → the new leader's `Elected`,
//! - `Elected` → registry recovered (`RegistryStore::load` of N agents + weights/quotas/frameworks),
//!
//! for registries of 1,000 and 10,000 agents. Agent re-registration over QUIC is measured by the
//! cluster benchmark, not here.
//!
//! Run: `cargo bench -p gantry-master --bench ha_failover` (add `--profile dev` to skip the
//! release build: the numbers are dominated by etcd and the TTL, not by our code).
//! Environment: `HA_BENCH_ROUNDS` (default 3), `HA_BENCH_AGENTS` (default `1000,10000`).

use std::time::{Duration, Instant};

use etcd_client::{EventType, WatchOptions};
use gantry_master::election::{Fence, LeadershipEvent};
use gantry_master::registry::{
    AgentRecord, EtcdStore, Mutation, Quota, RegistryStore, RegistryWriter,
};
use gantry_proto::ids::AgentId;
use gantry_proto::resources::{ResourceLimits, Resources};
use gantry_test_support::election::*;

struct Round {
    kill_to_expiry: Duration,
    expiry_to_elected: Duration,
    elected_to_loaded: Duration,
    kill_to_loaded: Duration,
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

fn stats(values: &[Duration]) -> String {
    let mut v: Vec<Duration> = values.to_vec();
    v.sort();
    let mean = v.iter().sum::<Duration>() / v.len() as u32;
    format!("{} / {} / {}", ms(v[0]), ms(mean), ms(v[v.len() - 1]))
}

/// Default-like production config: 3 s TTL.
fn bench_config(
    url: &str,
    advertise: &str,
    prefix: &str,
) -> gantry_master::election::EtcdElectionConfig {
    let mut cfg = config(url, advertise, prefix);
    cfg.lease_ttl = Duration::from_secs(3);
    cfg.request_timeout = Duration::from_secs(1);
    cfg
}

/// Admits `agents` agents one submission each through the group-committing writer (as a burst
/// of first registrations would), plus weights and quotas. Returns the number of transactions.
async fn seed(url: &str, prefix: &str, agents: usize, fence: Fence) -> anyhow::Result<u64> {
    let store = EtcdStore::connect(&[url.to_string()], prefix, Duration::from_secs(10)).await?;
    store.set_fence(fence);
    let store = RegistryStore::Etcd(store);
    let writer = RegistryWriter::spawn(store.clone());
    let pending: Vec<_> = (0..agents as u128)
        .map(|i| {
            writer.submit(vec![Mutation::PutAgent(AgentRecord {
                id: AgentId::from_u128(i + 1),
                name: format!("agent-{i}"),
                hostname: format!("host-{i}.example"),
                deactivated: false,
            })])
        })
        .collect();
    for p in pending {
        p.await?;
    }
    for role in ["prod", "dev", "batch"] {
        store.set_weight(role, 2.0).await?;
        store
            .set_quota(
                role,
                Quota {
                    guarantee: Resources::parse("cpus:10;mem:10240")?,
                    limit: ResourceLimits::parse("cpus:100;mem:102400")?,
                },
            )
            .await?;
    }
    Ok(writer
        .stats()
        .commits
        .load(std::sync::atomic::Ordering::Relaxed))
}

async fn run(agents: usize, rounds: usize) -> anyhow::Result<Vec<Round>> {
    let etcd = start_etcd();
    let url = etcd.client_url();
    let p = prefix(&format!("bench-{agents}"));
    let log = new_log();
    let mut nodes: Vec<Node> = (0..3)
        .map(|i| {
            Node::start(
                &format!("m{i}"),
                bench_config(&url, &format!("m{i}:5050"), &p),
                log.clone(),
            )
        })
        .collect();
    let mut next_id = 3;
    anyhow::ensure!(
        wait_until(Duration::from_secs(15), || nodes
            .iter()
            .any(|n| n.is_leader()))
        .await,
        "no leader"
    );
    let leader = nodes.iter().position(|n| n.is_leader()).unwrap();
    let fence = elections(&log, &nodes[leader].name)[0].1.clone();
    let t = Instant::now();
    let commits = seed(&url, &p, agents, fence).await?;
    eprintln!(
        "admitted {agents} agents (one submission each, {commits} transactions) in {:?}",
        t.elapsed()
    );

    let mut client = etcd_client::Client::connect([url.as_str()], None).await?;
    let mut out = Vec::new();
    for round in 0..rounds {
        // Let keep-alives settle, as in a running cluster.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let leader = nodes
            .iter()
            .position(|n| n.is_leader())
            .ok_or_else(|| anyhow::anyhow!("no leader before round {round}"))?;
        let name = nodes[leader].name.clone();
        let Some((_, Fence::Etcd { leader_key, .. }, _)) = elections(&log, &name).last().cloned()
        else {
            anyhow::bail!("no etcd fence for {name}");
        };
        let mut watch = client
            .watch(leader_key.clone(), Some(WatchOptions::new()))
            .await?;
        let before = log.lock().unwrap().len();

        let t_kill = Instant::now();
        let mut dead = nodes.remove(leader);
        dead.kill().await;
        // etcd deletes the key when the lease expires.
        let t_expiry = loop {
            let resp = tokio::time::timeout(Duration::from_secs(10), watch.message())
                .await??
                .ok_or_else(|| anyhow::anyhow!("watch ended"))?;
            if resp
                .events()
                .iter()
                .any(|e| e.event_type() == EventType::Delete)
            {
                break Instant::now();
            }
        };
        // The new leader's Elected event.
        let deadline = Instant::now() + Duration::from_secs(10);
        let (new_name, elected_at) = loop {
            let found = log.lock().unwrap()[before..]
                .iter()
                .find_map(|l| match &l.event {
                    LeadershipEvent::Elected { at, .. } => Some((l.node.clone(), *at)),
                    _ => None,
                });
            if let Some(f) = found {
                break f;
            }
            anyhow::ensure!(Instant::now() < deadline, "no new leader");
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        // The new leader recovers the registry before serving.
        let store =
            EtcdStore::connect(std::slice::from_ref(&url), &p, Duration::from_secs(10)).await?;
        let t_load = Instant::now();
        let registry = RegistryStore::Etcd(store).load().await?;
        let loaded_at = Instant::now();
        anyhow::ensure!(registry.agents.len() == agents, "registry incomplete");
        let r = Round {
            kill_to_expiry: t_expiry.duration_since(t_kill),
            expiry_to_elected: elected_at.saturating_duration_since(t_expiry),
            elected_to_loaded: loaded_at.duration_since(t_load),
            kill_to_loaded: elected_at.duration_since(t_kill) + loaded_at.duration_since(t_load),
        };
        eprintln!(
            "round {round}: {name} killed; {new_name} elected; kill->expiry {} ms, expiry->elected {} ms, load {} ms",
            ms(r.kill_to_expiry),
            ms(r.expiry_to_elected),
            ms(r.elected_to_loaded)
        );
        out.push(r);
        // Replace the dead master so three keep campaigning.
        nodes.push(Node::start(
            &format!("m{next_id}"),
            bench_config(&url, &format!("m{next_id}:5050"), &p),
            log.clone(),
        ));
        next_id += 1;
    }
    assert_no_two_leaders(&log);
    Ok(out)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench`; nothing to parse.
    let rounds: usize = std::env::var("HA_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let sizes: Vec<usize> = std::env::var("HA_BENCH_AGENTS")
        .unwrap_or_else(|_| "1000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let mut table = String::from(
        "| agents | kill → lease expiry (ms) | expiry → new leader elected (ms) | registry load (ms) | kill → registry recovered (ms) |\n|---|---|---|---|---|\n",
    );
    for agents in sizes {
        let rs = run(agents, rounds).await?;
        let col = |f: fn(&Round) -> Duration| stats(&rs.iter().map(f).collect::<Vec<_>>());
        table.push_str(&format!(
            "| {agents} | {} | {} | {} | {} |\n",
            col(|r| r.kill_to_expiry),
            col(|r| r.expiry_to_elected),
            col(|r| r.elected_to_loaded),
            col(|r| r.kill_to_loaded),
        ));
    }
    println!("\nHA failover, lease TTL 3 s, {rounds} rounds each (min / mean / max):\n\n{table}");
    Ok(())
}
