//! The fault-injection soak: a real etcd, 3 HA masters, 3 agents with cgroup isolation and a
//! partition-aware framework running `GANTRY_SOAK_TASKS` units of work (default 40) through
//! `GANTRY_SOAK_FAULTS` seeded faults (default 6: one of each kind; seed `GANTRY_SOAK_SEED`,
//! default 1): an agent `kill -9`ed and restarted, the leading master `kill -9`ed (restarted
//! as a standby), an agent `SIGSTOP`ped until the master finds it unreachable then `SIGCONT`ed
//! (its tasks UNREACHABLE, then back), an agent `SIGSTOP`ped past the unreachable timeout too
//! (its tasks GONE and launched again; it comes back as a new agent), etcd `kill -9`ed and
//! restarted, the framework killed and failed over to a new driver with its framework id.
//! Masters that exit (a leader that lost etcd steps down and exits) are started again as
//! standbys, as their supervisor would. `GANTRY_SOAK_LOGS=DIR` keeps the processes' logs there.
//!
//! Each task appends `start UNIT TASK` and `done UNIT TASK` to a ledger (see
//! `gantry_tests::soak`), which counts what ran independently of Gantry. The work is released
//! a slice at a time and each fault fires halfway through its slice, so it always hits running
//! tasks. The soak prints a report (per fault: its target, outage and time to recover; then
//! tasks executed, task ids executed twice, units never executed, units executed twice after a
//! loss, leftovers) and asserts, at every size: every unit executed, no task id executed twice,
//! a unit executed twice only when its first task was LOST/GONE (named in the report), no task
//! FAILED, no second or rewritten terminal update, no leftover task process or task cgroup, one
//! sandbox per task started, and every fault recovered within `RECOVERY_BOUND`.
//!
//! Larger: `GANTRY_SOAK_TASKS=2000 GANTRY_SOAK_FAULTS=20 cargo test -p gantry-tests --test soak
//! -- --nocapture` (tests/README.md, docs/ha.md).

use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_sdk::protocol::{Capability, FrameworkId};
use gantry_sdk::{Driver, DriverHandle};
use gantry_tests::etcd::EtcdServer;
use gantry_tests::soak::{
    fault_schedule, release, report, started_tasks, Book, FaultKind, FaultRecord, Ledger,
    Leftovers, Report, Rng, SoakFramework, SoakSpec,
};
use gantry_tests::{
    cgroups_available, driver_config, http_get, running_tasks, sandbox_count, AgentProc,
    CgroupRoot, MasterProc, TempDir,
};

/// `--agent-reregister-timeout` of the masters: a paused agent is unreachable this long after
/// the master dropped its connection (15 s of silence: the QUIC idle timeout).
const REREGISTER_SECS: u64 = 3;
/// `--agent-unreachable-timeout` of the masters: an agent paused this much longer is gone.
const UNREACHABLE_SECS: u64 = 8;
/// How long the cluster must stay whole to count as recovered.
const SETTLE: Duration = Duration::from_secs(3);
/// The most any fault may take to recover from.
const RECOVERY_BOUND: Duration = Duration::from_secs(90);
/// The framework's failover timeout: long past its own kill.
const FAILOVER_SECS: f64 = 300.0;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number")),
        Err(_) => default,
    }
}

type DriverRun = tokio::task::JoinHandle<Result<(), gantry_sdk::scheduler::DriverError>>;

struct Soak {
    rt: tokio::runtime::Runtime,
    rng: Rng,
    masters: Vec<MasterProc>,
    agents: Vec<AgentProc>,
    etcd: EtcdServer,
    tls: PathBuf,
    spec: Arc<SoakSpec>,
    book: Arc<Mutex<Book>>,
    framework: Option<(DriverHandle, DriverRun)>,
    framework_id: Option<FrameworkId>,
    began: Instant,
    /// Masters that exited (etcd outages make a leader step down and exit) and were started
    /// again.
    exits: Vec<String>,
    /// Removed last (the agents and masters work in it).
    dir: TempDir,
}

impl Soak {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finished(&self) -> usize {
        self.book().finished.len()
    }

    /// The one master that says it leads, if exactly one does.
    fn leader(&self) -> Option<usize> {
        let l: Vec<usize> = (0..self.masters.len())
            .filter(|&i| {
                http_get(self.masters[i].http, "/health")
                    .ok()
                    .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
                    .is_some_and(|h| h["role"] == "leader")
            })
            .collect();
        (l.len() == 1).then(|| l[0])
    }

    fn leader_state(&self) -> Option<serde_json::Value> {
        self.leader().and_then(|l| self.masters[l].state().ok())
    }

    /// Whether the cluster is whole: one leader, every agent registered with it, the framework
    /// subscribed, no task UNREACHABLE. The leader, or the reason it is not whole.
    fn whole(&self) -> Result<usize, String> {
        let l = self.leader().ok_or("no single leader")?;
        let s = self.masters[l]
            .state()
            .map_err(|e| format!("leader's /state: {e:#}"))?;
        for a in &self.agents {
            let ok = s["agents"].as_array().is_some_and(|v| {
                v.iter()
                    .any(|x| x["name"] == a.name.as_str() && x["connected"] == true)
            });
            if !ok {
                return Err(format!("agent {} not registered", a.name));
            }
        }
        if let Some(id) = self.framework_id {
            let ok = s["frameworks"].as_array().is_some_and(|v| {
                v.iter()
                    .any(|f| f["id"] == id.to_string() && f["connected"] == true)
            });
            if !ok {
                return Err("framework not subscribed".into());
            }
        }
        let unreachable = s["tasks"].as_array().map_or(0, |t| {
            t.iter().filter(|t| t["state"] == "UNREACHABLE").count()
        });
        if unreachable > 0 {
            return Err(format!("{unreachable} tasks UNREACHABLE"));
        }
        Ok(l)
    }

    /// Starts masters that exited (as their supervisor would), once another one leads; whether
    /// one had exited.
    fn revive_masters(&mut self) -> bool {
        let mut exited = false;
        let running: Vec<bool> = self
            .masters
            .iter_mut()
            .map(|m| m.proc.is_running())
            .collect();
        for i in 0..self.masters.len() {
            if !running[i] {
                exited = true;
                // Into a cluster with a leader, as a standby (or all again if none runs).
                if running.contains(&true) && self.leader().is_none() {
                    continue;
                }
                self.exits.push(format!(
                    "master {i} exited, started again (+{:.1} s)",
                    self.began.elapsed().as_secs_f64()
                ));
                eprintln!("soak: master {i} exited; starting it again as a standby");
                self.masters[i].restart().expect("master restarts");
            }
        }
        exited
    }

    /// Waits until the cluster is whole and `also` holds, and stays so with the same leader and
    /// every master running for [`SETTLE`] (a leader that steps down late, after an etcd outage
    /// say, is not a recovery): the time until the start of that stretch. Panics (with the
    /// logs' tails) past [`RECOVERY_BOUND`].
    fn wait_whole(&mut self, what: &str, also: impl Fn(&Self) -> bool) -> Duration {
        let t = Instant::now();
        let mut since: Option<(Instant, usize)> = None;
        loop {
            let exited = self.revive_masters();
            let why = match self.whole() {
                Ok(_) if exited => "a master exited".to_string(),
                Ok(l) if also(self) => {
                    match since {
                        Some((at, l0)) if l0 == l => {
                            if at.elapsed() >= SETTLE {
                                return at - t;
                            }
                        }
                        _ => since = Some((Instant::now(), l)),
                    }
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                Ok(_) => format!("{what}: not yet"),
                Err(e) => e,
            };
            since = None;
            if t.elapsed() > RECOVERY_BOUND {
                self.dump_tails();
                panic!(
                    "{what}: not recovered within {RECOVERY_BOUND:?}: {why}\n{}",
                    self.etcd.log_tail(10)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Copies every log of the soak (masters, agents, etcd) into `to`.
    fn keep_logs(&self, to: &std::path::Path) {
        let _ = std::fs::create_dir_all(to);
        let mut logs: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        logs.retain(|p| p.to_string_lossy().contains(".log"));
        logs.push(self.etcd.dir().join("etcd.log"));
        for p in logs {
            if let Some(name) = p.file_name() {
                let _ = std::fs::copy(&p, to.join(name));
            }
        }
        eprintln!("soak: logs kept in {}", to.display());
    }

    fn dump_tails(&self) {
        let tail = |p: &std::path::Path| {
            let t = std::fs::read_to_string(p).unwrap_or_default();
            let l: Vec<&str> = t.lines().collect();
            l[l.len().saturating_sub(40)..].join("\n")
        };
        for m in &self.masters {
            eprintln!("---- {} ----\n{}", m.log.display(), tail(&m.log));
        }
        for a in &self.agents {
            eprintln!("---- {} ----\n{}", a.log.display(), tail(&a.log));
        }
    }

    fn start_framework(&mut self) {
        let addrs: Vec<String> = self.masters.iter().map(|m| m.quic.to_string()).collect();
        let mut config = driver_config(addrs, self.tls.clone(), "soak", vec!["soak".into()]);
        config.info.capabilities.push(Capability::PartitionAware);
        config.info.failover_timeout_secs = FAILOVER_SECS;
        config.info.framework_id = self.framework_id;
        let driver = Driver::new(config);
        let handle = driver.handle();
        let scheduler = SoakFramework {
            spec: self.spec.clone(),
            book: self.book.clone(),
        };
        let run = self.rt.spawn(driver.run(scheduler));
        self.framework = Some((handle, run));
    }

    fn handle(&self) -> DriverHandle {
        self.framework.as_ref().expect("framework runs").0.clone()
    }

    fn registrations(&self) -> usize {
        self.book().registrations.len()
    }

    fn agent_registrations(&self, i: usize) -> usize {
        std::fs::read_to_string(&self.agents[i].log)
            .map(|t| t.matches("registered with the master").count())
            .unwrap_or(0)
    }

    /// The agent a fault hits: one of those running the most tasks (seeded among equals).
    fn pick_agent(&mut self) -> usize {
        let s = self.leader_state();
        let running: Vec<usize> = self
            .agents
            .iter()
            .map(|a| {
                let Some(s) = &s else { return 0 };
                let id = s["agents"]
                    .as_array()
                    .and_then(|v| v.iter().find(|x| x["name"] == a.name.as_str()))
                    .map(|x| x["id"].clone());
                s["tasks"].as_array().map_or(0, |t| {
                    t.iter()
                        .filter(|t| Some(&t["agent_id"]) == id.as_ref() && t["state"] == "RUNNING")
                        .count()
                })
            })
            .collect();
        let most = running.iter().copied().max().unwrap_or(0);
        let busiest: Vec<usize> = (0..running.len()).filter(|&i| running[i] == most).collect();
        busiest[self.rng.below(busiest.len() as u64) as usize]
    }

    /// Injects one fault; returns its record.
    fn inject(&mut self, kind: FaultKind) -> FaultRecord {
        let at = self.began.elapsed();
        let finished_before = self.finished();
        let leader_before = self.leader();
        let running = self.leader_state().map_or(0, |s| running_tasks(&s));
        let exits_before = self.exits.len();
        let mut rec = FaultRecord {
            kind,
            target: String::new(),
            at,
            finished_before,
            running,
            outage: Duration::ZERO,
            recovery: Duration::ZERO,
            note: String::new(),
        };
        match kind {
            FaultKind::AgentRestart => {
                let i = self.pick_agent();
                rec.target.clone_from(&self.agents[i].name);
                let before = self.agent_registrations(i);
                let t0 = Instant::now();
                self.agents[i].kill9();
                std::thread::sleep(self.rng.millis(200, 1500));
                self.agents[i].restart().expect("agent restarts");
                rec.outage = t0.elapsed();
                rec.recovery =
                    self.wait_whole("agent restart", |s| s.agent_registrations(i) > before);
            }
            FaultKind::LeaderKill => {
                let l = leader_before.expect("a leader before the fault");
                rec.target = format!("master {l}");
                self.masters[l].proc.kill9();
                rec.recovery =
                    self.wait_whole("leader kill", |s| s.leader().is_some_and(|n| n != l));
                // `wait_whole` started it again once another led: it must stand by.
                let h = self.masters[l].health().expect("restarted master answers");
                assert_eq!(h["role"], "standby", "{h}");
            }
            FaultKind::AgentPause | FaultKind::AgentLost => {
                let i = self.pick_agent();
                rec.target.clone_from(&self.agents[i].name);
                let (outage, note) = self.pause(i, kind == FaultKind::AgentLost);
                rec.outage = outage;
                rec.note = note;
                rec.recovery = self.wait_whole(kind.name(), |_| true);
            }
            FaultKind::EtcdRestart => {
                rec.target = "etcd".into();
                let t0 = Instant::now();
                self.etcd.kill();
                // Longer than the lease TTL (2 s): the leader cannot renew and steps down.
                std::thread::sleep(self.rng.millis(2500, 4500));
                self.etcd.restart().expect("etcd restarts");
                rec.outage = t0.elapsed();
                rec.recovery = self.wait_whole("etcd restart", |_| true);
            }
            FaultKind::FrameworkFailover => {
                rec.target = "framework".into();
                let before = self.registrations();
                let (_, run) = self.framework.take().expect("framework runs");
                let t0 = Instant::now();
                // Killed: no teardown, no goodbye; the driver and its connections dropped.
                run.abort();
                let _ = self.rt.block_on(run);
                std::thread::sleep(self.rng.millis(300, 2000));
                self.start_framework();
                rec.outage = t0.elapsed();
                rec.recovery =
                    self.wait_whole("framework failover", |s| s.registrations() > before);
                let regs = self.book().registrations.clone();
                assert!(
                    regs.iter().all(|(_, id)| Some(*id) == self.framework_id),
                    "the framework failed over to another id: {regs:?}"
                );
            }
        }
        let leader_after = self.leader();
        let mut notes = vec![format!(
            "leader {} -> {}",
            leader_before.map_or("-".into(), |l| l.to_string()),
            leader_after.map_or("-".into(), |l| l.to_string())
        )];
        if !rec.note.is_empty() {
            notes.push(std::mem::take(&mut rec.note));
        }
        notes.extend(self.exits[exits_before..].iter().cloned());
        rec.note = notes.join("; ");
        assert!(rec.recovery <= RECOVERY_BOUND, "{rec:?}");
        eprintln!("soak: {rec:?}");
        rec
    }

    /// `SIGSTOP`s agent `i` until the master found it unreachable (its running tasks
    /// UNREACHABLE), or, when `lost`, until its unreachable timeout passed too (its tasks GONE),
    /// then `SIGCONT`s it. How long it was stopped, and a note.
    fn pause(&mut self, i: usize, lost: bool) -> (Duration, String) {
        let name = self.agents[i].name.clone();
        let s = self.leader_state().expect("leader state");
        let id = s["agents"]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["name"] == name.as_str()))
            .map(|a| a["id"].as_str().unwrap_or_default().to_string())
            .expect("agent listed");
        let on_agent = |s: &serde_json::Value, list: &str, state: &str| {
            s[list].as_array().map_or(0, |t| {
                t.iter()
                    .filter(|t| t["agent_id"] == id.as_str() && t["state"] == state)
                    .count()
            })
        };
        let had = on_agent(&s, "tasks", "RUNNING") + on_agent(&s, "tasks", "STAGING");
        let lost_before = self.book().lost.len();
        let pid = self.agents[i].proc.pid();
        let t0 = Instant::now();
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        // Its tasks run on (and may finish) meanwhile; they cannot tell anyone.
        let timeout = Duration::from_secs(if lost { 120 } else { 60 });
        let mut dropped_at = None;
        let mut unreachable = 0;
        let mut gone;
        loop {
            if t0.elapsed() > timeout {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGCONT) };
                self.dump_tails();
                panic!(
                    "paused agent {name}: not unreachable{} within {timeout:?}",
                    if lost { " and gone" } else { "" }
                );
            }
            std::thread::sleep(Duration::from_millis(100));
            let Some(s) = self.leader_state() else {
                continue;
            };
            unreachable = unreachable.max(on_agent(&s, "tasks", "UNREACHABLE"));
            gone = self.book().lost.len() - lost_before;
            let connected = s["agents"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|a| a["id"] == id.as_str() && a["connected"] == true)
            });
            if !connected && dropped_at.is_none() {
                dropped_at = Some(Instant::now());
            }
            let mut wait = REREGISTER_SECS * 1000 + 1500;
            if lost {
                wait += UNREACHABLE_SECS * 1000;
            }
            let past = dropped_at.is_some_and(|d| d.elapsed() > Duration::from_millis(wait));
            // (`had` is what /state showed just before the stop: a task may have ended in
            // between, so the timeouts decide, not the counts.)
            let done = if lost {
                past && on_agent(&s, "tasks", "UNREACHABLE") == 0
            } else {
                unreachable > 0 || past
            };
            if done {
                break;
            }
        }
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        let note = if lost {
            format!("{had} tasks there, {unreachable} UNREACHABLE, {gone} GONE")
        } else {
            format!("{had} tasks there, {unreachable} UNREACHABLE")
        };
        (t0.elapsed(), note)
    }
}

#[test]
fn soak_faults_lose_nothing_and_run_nothing_twice() {
    if !cgroups_available("soak") {
        return;
    }
    let units = env_u64("GANTRY_SOAK_TASKS", 40).max(1) as usize;
    let faults = env_u64("GANTRY_SOAK_FAULTS", 6) as usize;
    let seed = env_u64("GANTRY_SOAK_SEED", 1);
    let mut rng = Rng::new(seed);
    let schedule = fault_schedule(&mut rng, faults);
    // The work comes in `faults + 1` slices; an agent has room for a third of one (2..8 tasks).
    let slice = units.div_ceil(faults + 1);
    let per_agent = slice.div_ceil(3).clamp(2, 8);
    eprintln!(
        "soak: seed {seed}, {units} units in slices of {slice}, {per_agent} tasks per agent, \
         faults {schedule:?}"
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let etcd = EtcdServer::start().unwrap();
    let dir = TempDir::new("gantry-soak").unwrap();
    let tls = dir.path().join("tls");
    // The ledger: written by the tasks (user `nobody`).
    let ledger_dir = dir.path().join("ledger");
    std::fs::create_dir(&ledger_dir).unwrap();
    let ledger = ledger_dir.join("ledger");
    std::fs::write(&ledger, "").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ledger_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&ledger, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let url = etcd.client_url();
    let rereg = REREGISTER_SECS.to_string();
    let unreach = UNREACHABLE_SECS.to_string();
    let mut masters = Vec::new();
    for _ in 0..3 {
        masters.push(
            MasterProc::start(
                dir.path(),
                &tls,
                &[
                    "--etcd",
                    &url,
                    "--lease-ttl",
                    "2",
                    "--agent-reregister-timeout",
                    &rereg,
                    "--agent-unreachable-timeout",
                    &unreach,
                ],
            )
            .unwrap(),
        );
    }
    let addrs: Vec<String> = masters.iter().map(|m| m.quic.to_string()).collect();
    let resources = format!("cpus:{per_agent};mem:{}", per_agent * 256);
    let agents: Vec<AgentProc> = (0..3)
        .map(|i| {
            AgentProc::start_multi_with(
                dir.path(),
                &tls,
                &addrs.join(","),
                &format!("soak{i}-{}", std::process::id()),
                &resources,
                // Every sandbox kept, to be counted: even with `--gc-disk-headroom 0` the
                // collection delay shrinks with the disk's use (an hour times the free
                // fraction: 3.6 min on a disk 94% full).
                &["--gc-keep", "1000000"],
            )
            .unwrap()
        })
        .collect();
    let mut sleeps: Vec<Duration> = (0..units).map(|_| rng.millis(500, 3000)).collect();
    // The second half of a pause's slice runs when the pause begins: every other of those
    // tasks outlasts the pause, the rest (6-10 s) end while their agent is stopped. On an agent
    // paused past its re-register timeout they come back RUNNING or FINISHED; on one lost past
    // the unreachable timeout too they are all GONE and launched again: the long ones are
    // killed when the agent rejoins, the others ran to the end (units executed twice).
    for (i, kind) in schedule.iter().enumerate() {
        let long = match kind {
            FaultKind::AgentPause => Duration::from_secs(25),
            FaultKind::AgentLost => Duration::from_secs(45),
            _ => continue,
        };
        let second_half = (i * slice + slice / 2)..((i + 1) * slice).min(units);
        for (k, u) in second_half.enumerate() {
            sleeps[u] = if k % 2 == 0 {
                long
            } else {
                rng.millis(6000, 10_000)
            };
        }
    }
    let spec = Arc::new(SoakSpec {
        units,
        sleeps,
        resources: "cpus:1;mem:32".parse().unwrap(),
        ledger: ledger.clone(),
        run_token: dir.path().display().to_string(),
    });
    let mut book = Book::new(units);
    book.limit = slice;
    let mut soak = Soak {
        rt,
        rng,
        masters,
        agents,
        etcd,
        tls,
        spec: spec.clone(),
        book: Arc::new(Mutex::new(book)),
        framework: None,
        framework_id: None,
        began: Instant::now(),
        exits: Vec::new(),
        dir,
    };
    soak.wait_whole("the cluster to form", |_| true);
    soak.start_framework();
    let deadline = Instant::now() + Duration::from_secs(60);
    while soak.registrations() == 0 {
        assert!(Instant::now() < deadline, "the framework never subscribed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let id = soak.book().registrations[0].1;
    soak.framework_id = Some(id);
    soak.began = Instant::now();

    // Generous: the work in the slowest case (one agent at a time), plus every fault's bound.
    let work = spec.sleeps.iter().sum::<Duration>() / per_agent as u32;
    let finish_by = Instant::now() + work + RECOVERY_BOUND * (faults as u32 + 1);
    let wait_finished = |soak: &Soak, n: usize, what: &str| {
        while soak.finished() < n {
            if Instant::now() > finish_by {
                soak.dump_tails();
                let b = soak.book();
                panic!(
                    "{what}: {} of {n} units finished; open tasks: {:?}; anomalies: {:?}",
                    b.finished.len(),
                    b.open_tasks()
                        .iter()
                        .map(|t| (&b.attempts[t].name, &b.attempts[t].history))
                        .collect::<Vec<_>>(),
                    b.anomalies
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut records = Vec::new();
    for (i, kind) in schedule.iter().enumerate() {
        // Halfway through slice `i`: the other half runs when the fault hits.
        let half = (i * slice + slice / 2).min(units.saturating_sub(1));
        wait_finished(&soak, half, &format!("before fault {}", i + 1));
        records.push(soak.inject(*kind));
        release(&soak.book, &spec, &soak.handle(), (i + 2) * slice);
    }
    wait_finished(&soak, units, "the end");
    let elapsed = soak.began.elapsed();
    soak.wait_whole("the end", |_| true);

    // Stop the framework (teardown: nothing should be left to kill).
    let (handle, run) = soak.framework.take().unwrap();
    handle.stop();
    soak.rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), run).await })
        .expect("the framework stops")
        .unwrap()
        .expect("the driver ends cleanly");

    // Leftovers: task processes and task cgroups gone within a few seconds of the end.
    let roots: Vec<ManuallyDrop<CgroupRoot>> = soak
        .agents
        .iter()
        .map(|a| {
            // Only inspected: the agents' own drop removes their roots.
            ManuallyDrop::new(CgroupRoot {
                name: format!("gantry/{}", a.name),
            })
        })
        .collect();
    let leftover = || {
        let procs: Vec<String> = gantry_tests::soak::soak_processes(&spec.run_token)
            .into_iter()
            .map(|(pid, cmd)| format!("{pid} {cmd}"))
            .collect();
        let cgroups: Vec<String> = roots
            .iter()
            .flat_map(|r| r.task_cgroups())
            .map(|p| p.display().to_string())
            .collect();
        (procs, cgroups)
    };
    let until = Instant::now() + Duration::from_secs(15);
    let (processes, cgroups) = loop {
        let (p, c) = leftover();
        if (p.is_empty() && c.is_empty()) || Instant::now() > until {
            break (p, c);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let ledger_read = Ledger::read(&ledger).unwrap();
    let book = soak.book().clone();
    let leftovers = Leftovers {
        processes,
        cgroups,
        sandboxes: sandbox_count(&soak.agents),
        started: started_tasks(&ledger_read).len(),
    };
    let r = ledger_read.reconcile(&book);
    println!(
        "{}",
        report(&Report {
            seed,
            spec: &spec,
            faults: &records,
            book: &book,
            ledger: &ledger_read,
            reconciled: &r,
            leftovers: &leftovers,
            elapsed,
        })
    );

    assert!(
        r.never_executed.is_empty(),
        "never executed: {:?}",
        r.never_executed
    );
    assert!(
        r.task_twice.is_empty(),
        "task ids executed twice: {:?}",
        r.task_twice
    );
    assert!(
        r.unit_twice_unexplained.is_empty(),
        "units executed twice without a loss: {:?}",
        r.unit_twice_unexplained
    );
    assert!(
        r.unknown.is_empty() && r.inconsistent.is_empty() && ledger_read.malformed.is_empty(),
        "ledger: {:?} {:?} {:?}",
        r.unknown,
        r.inconsistent,
        ledger_read.malformed
    );
    assert_eq!(r.executions, units + r.unit_twice_after_loss.len());
    assert!(book.failures.is_empty(), "failures: {:?}", book.failures);
    assert!(book.anomalies.is_empty(), "anomalies: {:?}", book.anomalies);
    assert!(
        leftovers.processes.is_empty(),
        "task processes left: {:?}",
        leftovers.processes
    );
    assert!(
        leftovers.cgroups.is_empty(),
        "task cgroups left: {:?}",
        leftovers.cgroups
    );
    // One sandbox per task that started; none for a task that never did beyond the launches.
    assert!(
        leftovers.sandboxes >= leftovers.started && leftovers.sandboxes <= book.launched,
        "{} sandboxes for {} tasks started, {} launched",
        leftovers.sandboxes,
        leftovers.started,
        book.launched
    );
    assert_eq!(records.len(), faults);
    if let Ok(keep) = std::env::var("GANTRY_SOAK_LOGS") {
        soak.keep_logs(std::path::Path::new(&keep));
    }
    drop(soak);
}
