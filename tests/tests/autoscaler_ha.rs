//! Two copies of `gantry-autoscaler` in one etcd election (issue 31, item 7), over a real
//! etcd, a real master and the local provider (real agents with stand-in GPUs): a GPU pool with
//! `min = 1`, so whichever copy acts starts one node at once, and one that did not act would
//! start a second.
//! - Exactly one copy acts: one node of the pool for several rounds, one report.
//! - The node's agent carries its pool's price as the attribute `price_per_hour` (the contract
//!   the master's usage and the queue price with).
//! - `kill -9` of the acting copy (its agent goes with it): the standby scales the pool back
//!   to its minimum within the lease TTL + a round (+ slack for the process starts), and the
//!   new node registers.
//! - The cost report continues across the failover (its totals are kept in etcd): the new
//!   leader's report counts the killed leader's node and node-seconds beside its own.
//!
//! One test in this binary: the local provider's agents share the host's cgroups.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gantry_tests::etcd::EtcdServer;
use gantry_tests::{cgroups_available, CgroupRoot, Cluster, Proc};

const PRICE: &str = "36";
const TTL_S: u64 = 2;
const INTERVAL_MS: u64 = 500;

fn pools_toml() -> String {
    format!(
        r#"
[autoscaler]
interval = "{INTERVAL_MS}ms"

[[pool]]
name = "gpu"
cpus = 2
mem = 2048
gpus = 2
gpu_model = "NVIDIA A100-SXM4-40GB"
price_per_hour = {PRICE}
min = 1
max = 2
scale_down_cooldown = "1h"
provider = {{ kind = "local" }}
"#
    )
}

fn read_status(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// The pool's agents the master has connected now: (name, its `price_per_hour` attribute).
fn pool_agents(cluster: &Cluster) -> Vec<(String, String)> {
    let Ok(s) = cluster.master.state() else {
        return Vec::new();
    };
    s["agents"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["connected"] == true && a["attributes"]["pool"] == "gpu")
        .map(|a| {
            (
                a["name"].as_str().unwrap_or("").to_string(),
                a["attributes"]["price_per_hour"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect()
}

/// The cgroup root of node `node`'s agent (removed at the end: a killed copy's agent leaves
/// its own behind).
fn cgroup_root(node: &str) -> String {
    format!("gantry-test-{}-asha-{node}", std::process::id())
}

/// One copy: the harness's `gantry-autoscaler run` in the election, its agents in cgroups of
/// their own (removed at the end).
fn copy(cluster: &Cluster, etcd: &str, id: &str, pools: &Path, status: &Path) -> Command {
    let mut cmd = gantry_tests::frameworks::autoscaler_command(cluster, pools, status);
    cmd.args(["--etcd", etcd, "--ha-id", id, "--ha-lease-ttl"])
        .arg(format!("{TTL_S}s"));
    // The node names of both copies never collide: one cgroup root per node.
    let root = cgroup_root("{node}");
    for a in ["--cgroup-root", root.as_str()] {
        cmd.arg(format!("--local-agent-arg={a}"));
    }
    cmd
}

/// Kills what is left of the agents started under `nodes_dir` (a killed copy's), by their
/// command line naming that directory.
fn kill_agents_under(nodes_dir: &Path) {
    let needle = nodes_dir.to_string_lossy().into_owned();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&needle) && pid > 1 {
            // SAFETY: kill(2) on an agent this test's autoscaler started.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// On drop, even after a failed assertion: what is left of the agents under `nodes` killed, and
/// every node's cgroup root of this test removed.
struct Cleanup {
    nodes: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        kill_agents_under(&self.nodes);
        let prefix = cgroup_root("");
        let mut roots = BTreeSet::new();
        for h in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            for e in std::fs::read_dir(h.path()).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(&prefix) {
                    roots.insert(name);
                }
            }
        }
        for name in roots {
            drop(CgroupRoot { name });
        }
    }
}

#[test]
fn the_standby_autoscaler_takes_over_when_the_active_one_dies() {
    if !cgroups_available("autoscaler_ha") {
        return;
    }
    let etcd = EtcdServer::start().unwrap();
    let cluster = Cluster::start_with(&[], &[], &[]).unwrap();
    let dir = cluster.dir.path().to_path_buf();
    // Dropped after the copies (declared before them).
    let _cleanup = Cleanup {
        nodes: dir.join("nodes"),
    };
    let pools = dir.join("pools.toml");
    std::fs::write(&pools, pools_toml()).unwrap();
    let names = ["a", "b"];
    let status: Vec<PathBuf> = names
        .iter()
        .map(|n| dir.join(format!("status-{n}.json")))
        .collect();
    let logs: Vec<PathBuf> = names
        .iter()
        .map(|n| dir.join(format!("autoscaler-{n}.log")))
        .collect();
    let mut copies: Vec<Option<Proc>> = (0..2)
        .map(|i| {
            let cmd = copy(&cluster, &etcd.client_url(), names[i], &pools, &status[i]);
            Some(Proc::spawn("gantry-autoscaler", cmd, &logs[i]).unwrap())
        })
        .collect();
    let dump = |why: &str| {
        cluster.dump_logs();
        for l in &logs {
            eprintln!(
                "---- {} ----\n{}",
                l.display(),
                std::fs::read_to_string(l).unwrap_or_default()
            );
        }
        panic!("{why}");
    };

    // One copy leads and starts the pool's minimum: one node, registered.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (active, first) = loop {
        let agents = pool_agents(&cluster);
        let reporting: Vec<usize> = (0..2).filter(|&i| status[i].exists()).collect();
        if let ([i], [(name, _)]) = (reporting.as_slice(), agents.as_slice()) {
            break (*i, name.clone());
        }
        if Instant::now() > deadline {
            dump(&format!(
                "no single leader with one node: reports {reporting:?}, agents {agents:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let standby = 1 - active;
    // Several rounds later, still one node and one report: the standby never acted.
    let until = Instant::now() + Duration::from_millis(4 * INTERVAL_MS);
    while Instant::now() < until {
        let agents = pool_agents(&cluster);
        if agents.len() > 1 || status[standby].exists() {
            dump(&format!("both copies acted: agents {agents:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let agents = pool_agents(&cluster);
    assert_eq!(
        agents,
        [(first.clone(), PRICE.to_string())],
        "the pool's price"
    );
    let report = read_status(&status[active]).unwrap();
    assert_eq!(report["pools"][0]["nodes_created"], 1, "{report:#}");

    // kill -9 the acting copy: its agent goes with it; the standby takes over. Its last report
    // (saved in etcd with the round that wrote it) is what the new leader continues.
    let before = read_status(&status[active]).unwrap();
    let killed = Instant::now();
    if let Some(mut p) = copies[active].take() {
        p.kill9();
    }
    let mut scaled = None;
    let mut second = None;
    let deadline = killed + Duration::from_secs(20);
    while second.is_none() {
        if scaled.is_none()
            && read_status(&status[standby])
                .is_some_and(|r| r["pools"][0]["nodes_created"].as_u64() >= Some(1))
        {
            scaled = Some(killed.elapsed());
        }
        second = pool_agents(&cluster)
            .into_iter()
            .find(|(n, _)| *n != first)
            .map(|(n, price)| (n, price, killed.elapsed()));
        if Instant::now() > deadline {
            dump(&format!(
                "the standby did not take over: its report {:?}",
                read_status(&status[standby])
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (name, price, registered) = second.unwrap();
    let scaled = scaled
        .or_else(|| {
            read_status(&status[standby])
                .filter(|r| r["pools"][0]["nodes_created"].as_u64() >= Some(1))
                .map(|_| registered)
        })
        .unwrap();
    eprintln!(
        "takeover: the standby created its node {name} {:.2} s after the kill (TTL {TTL_S} s, round \
         {INTERVAL_MS} ms); registered {:.2} s after the kill",
        scaled.as_secs_f64(),
        registered.as_secs_f64()
    );
    assert_eq!(price, PRICE);
    // The lease TTL + a round, and 1.5 s for a process start and the report's poll.
    let bound = Duration::from_millis(TTL_S * 1000 + INTERVAL_MS + 1500);
    assert!(scaled <= bound, "took {scaled:?} (bound {bound:?})");
    // The totals continue: the killed leader's node and this one; node-seconds and cost at
    // least what the killed leader last reported (the new node's seconds come on top).
    let r = read_status(&status[standby]).unwrap();
    assert_eq!(r["pools"][0]["nodes_created"], 2, "{r:#}");
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(-1.0);
    let seconds_before = f(&before["pools"][0]["node_seconds"]);
    assert!(seconds_before > 0.0, "{before:#}");
    assert!(
        f(&r["pools"][0]["node_seconds"]) >= seconds_before,
        "{r:#}\nbefore: {before:#}"
    );
    assert!(f(&r["total_cost"]) >= f(&before["total_cost"]), "{r:#}");
    assert!(f(&r["total_cost"]) > 0.0);

    // Clean up: the standby stops its node on SIGTERM; the killed copy's agent and both
    // nodes' cgroups go ([`Cleanup`]).
    if let Some(mut p) = copies[standby].take() {
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(p.pid(), libc::SIGTERM);
        }
        let until = Instant::now() + Duration::from_secs(15);
        while p.is_running() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        p.kill9();
    }
    drop(etcd);
}
