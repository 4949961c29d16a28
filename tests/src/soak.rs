//! The fault-injection soak (`tests/soak.rs`): a seeded fault schedule, a partition-aware
//! framework whose bookkeeping survives its own kill (a new driver takes it over with the same
//! framework id), and the ledger the tasks write, which counts what really ran independently of
//! Gantry.
//!
//! Every task of the soak runs one *unit* of work (`SOAK_UNIT`) and appends `start UNIT TASK` to
//! the ledger when it starts and `done UNIT TASK` when its work is done (two `O_APPEND` writes of
//! a short line each: whole lines, never interleaved). [`Ledger::reconcile`] then compares what
//! ran with what the framework was told.
//!
//! The framework ([`SoakFramework`]) launches one task per unit owed. A unit is owed again when
//! its task was `LOST` or `GONE` (the documented semantics: the cluster lost it and whether it
//! ran is unknown: launch it again, once per loss) or `DROPPED` (it never ran). It waits for
//! `UNREACHABLE` tasks (they may still run). A task that `FAILED` by itself, was `KILLED` or is
//! an `ERROR` is owed again too, so the soak always completes, but is counted as a failure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_sdk::protocol::{
    CommandInfo, Demand, FrameworkId, Offer, Operation, Resources, StatusUpdate, TaskId, TaskInfo,
    TaskState,
};
use gantry_sdk::{DriverHandle, Scheduler};

mod summary;
pub use summary::{report, FaultRecord, Report};

/// A small seeded generator (xorshift64*): the soak's schedule and task lengths follow from
/// its seed alone.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed, so that small seeds differ in every bit; never 0.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `lo..=hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }
}

/// The faults the soak injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// `kill -9` an agent, then start it again (same work dir: it recovers its tasks).
    AgentRestart,
    /// `kill -9` the leading master; a standby takes over; the killed one is started again as a
    /// standby.
    LeaderKill,
    /// `SIGSTOP` an agent until the master has found it unreachable, then `SIGCONT`.
    AgentPause,
    /// `SIGSTOP` an agent past the master's unreachable timeout too (its tasks are `GONE` and
    /// launched again), then `SIGCONT`: it joins as a new agent and what it still runs is
    /// killed.
    AgentLost,
    /// `kill -9` etcd, then start it again on the same ports and data.
    EtcdRestart,
    /// Kill the framework (its driver aborted, nothing said to the master) and fail over to a
    /// new driver with the same framework id.
    FrameworkFailover,
}

impl FaultKind {
    pub const ALL: [FaultKind; 6] = [
        FaultKind::AgentRestart,
        FaultKind::LeaderKill,
        FaultKind::AgentPause,
        FaultKind::AgentLost,
        FaultKind::EtcdRestart,
        FaultKind::FrameworkFailover,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::AgentRestart => "agent kill+restart",
            FaultKind::LeaderKill => "leader kill",
            FaultKind::AgentPause => "agent pause",
            FaultKind::AgentLost => "agent lost (pause)",
            FaultKind::EtcdRestart => "etcd kill+restart",
            FaultKind::FrameworkFailover => "framework failover",
        }
    }
}

/// `count` faults: every kind once (in a seeded order) while they last, then seeded kinds.
pub fn fault_schedule(rng: &mut Rng, count: usize) -> Vec<FaultKind> {
    let mut kinds = FaultKind::ALL.to_vec();
    // Fisher-Yates.
    for i in (1..kinds.len()).rev() {
        kinds.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut out: Vec<FaultKind> = kinds.into_iter().take(count).collect();
    while out.len() < count {
        out.push(FaultKind::ALL[rng.below(FaultKind::ALL.len() as u64) as usize]);
    }
    out
}

/// What to run: `units` units of work, unit `u` sleeping `sleeps[u]` between its two ledger
/// lines, each task holding `resources`.
#[derive(Debug, Clone)]
pub struct SoakSpec {
    pub units: usize,
    pub sleeps: Vec<Duration>,
    pub resources: Resources,
    pub ledger: PathBuf,
    /// Put in every task's environment (`GANTRY_SOAK_RUN`): finds leftover task processes.
    pub run_token: String,
}

impl SoakSpec {
    /// The shell command every task runs (its unit and length come from its environment).
    pub fn command(&self) -> String {
        let l = self.ledger.display();
        format!(
            "echo \"start $SOAK_UNIT $GANTRY_TASK_ID\" >> {l} && sleep $SOAK_SLEEP && \
             echo \"done $SOAK_UNIT $GANTRY_TASK_ID\" >> {l}"
        )
    }
}

/// One task (an attempt at a unit) as the framework saw it.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub unit: usize,
    pub name: String,
    pub state: TaskState,
    /// Every update: state, whether it answered a reconciliation, its message.
    pub history: Vec<(TaskState, bool, String)>,
}

/// The framework's bookkeeping, shared by the drivers that run it one after another (a real
/// framework would keep it in its own store across a failover).
#[derive(Debug, Default, Clone)]
pub struct Book {
    pub attempts: BTreeMap<TaskId, Attempt>,
    /// Task ids of each unit, in launch order.
    pub unit_attempts: Vec<Vec<TaskId>>,
    /// Units owed a launch (never launched, or launched again after a loss).
    owed: BTreeSet<usize>,
    /// Units from this one on are held back: the soak releases its work a slice per fault, so
    /// that every fault finds tasks running however fast the rest goes.
    pub limit: usize,
    /// The task that FINISHED each finished unit.
    pub finished: BTreeMap<usize, TaskId>,
    /// Tasks the cluster lost (LOST or GONE) and whose unit was launched again.
    pub lost: Vec<(TaskId, TaskState, String)>,
    /// Tasks DROPPED (never ran) and launched again.
    pub dropped: Vec<TaskId>,
    /// Tasks that ended FAILED, KILLED or ERROR (not expected: the soak's commands succeed).
    pub failures: Vec<(TaskId, TaskState, String)>,
    /// Things that must not happen: a second terminal update, a terminal state rewritten, an
    /// update for a task the framework never launched, a unit finished twice.
    pub anomalies: Vec<String>,
    /// `UnknownOffer` errors: accepts that raced their offer's rescind (tasks DROPPED).
    pub offer_races: Vec<String>,
    /// When the framework (re-)subscribed.
    pub registrations: Vec<(Instant, FrameworkId)>,
    /// UNREACHABLE updates, and tasks that came back from UNREACHABLE.
    pub unreachable_updates: usize,
    pub resumed: usize,
    /// The last RUNNING update.
    pub last_running: Option<Instant>,
    /// Launches (tasks sent in accepts).
    pub launched: usize,
}

impl Book {
    pub fn new(units: usize) -> Self {
        Self {
            unit_attempts: vec![Vec::new(); units],
            owed: (0..units).collect(),
            limit: units,
            ..Default::default()
        }
    }

    /// Task ids not yet in a terminal state.
    pub fn open_tasks(&self) -> Vec<TaskId> {
        self.attempts
            .iter()
            .filter(|(_, a)| !a.state.is_terminal())
            .map(|(t, _)| *t)
            .collect()
    }

    pub fn all_finished(&self) -> bool {
        self.finished.len() == self.unit_attempts.len()
    }

    fn owe(&mut self, unit: usize) {
        if !self.finished.contains_key(&unit) {
            self.owed.insert(unit);
        }
    }

    /// Units owed a launch now (below the limit).
    pub fn launchable(&self) -> usize {
        self.owed.range(..self.limit).count()
    }

    /// The next unit to launch, if any is below the limit.
    fn next_unit(&mut self) -> Option<usize> {
        let u = *self.owed.first()?;
        (u < self.limit).then(|| {
            self.owed.remove(&u);
            u
        })
    }

    /// Applies one status update; returns whether a unit became owed (the driver revives).
    pub fn apply(&mut self, u: &StatusUpdate, now: Instant) -> bool {
        let Some(a) = self.attempts.get_mut(&u.task_id) else {
            self.anomalies.push(format!(
                "update {} for task {} the framework never launched",
                u.state, u.task_id
            ));
            return false;
        };
        a.history
            .push((u.state, u.reconciliation, u.message.clone()));
        let prev = a.state;
        let unit = a.unit;
        if prev.is_terminal() {
            if u.state != prev || !u.reconciliation {
                self.anomalies.push(format!(
                    "task {} ({}): {} after its terminal {prev}{} ({})",
                    u.task_id,
                    a.name,
                    u.state,
                    if u.reconciliation {
                        " (reconciliation)"
                    } else {
                        ""
                    },
                    u.message
                ));
            }
            return false;
        }
        if u.reconciliation && u.state == prev {
            return false;
        }
        a.state = u.state;
        match u.state {
            TaskState::Running => {
                self.last_running = Some(now);
                if prev == TaskState::Unreachable {
                    self.resumed += 1;
                }
                false
            }
            TaskState::Unreachable => {
                self.unreachable_updates += 1;
                false
            }
            TaskState::Finished => {
                if prev == TaskState::Unreachable {
                    self.resumed += 1;
                }
                if let Some(other) = self.finished.insert(unit, u.task_id) {
                    self.anomalies.push(format!(
                        "unit {unit} FINISHED twice: tasks {other} and {}",
                        u.task_id
                    ));
                }
                false
            }
            TaskState::Lost | TaskState::Gone => {
                self.lost.push((u.task_id, u.state, u.message.clone()));
                self.owe(unit);
                true
            }
            TaskState::Dropped => {
                self.dropped.push(u.task_id);
                self.owe(unit);
                true
            }
            TaskState::Failed | TaskState::Killed | TaskState::Error => {
                self.failures.push((u.task_id, u.state, u.message.clone()));
                self.owe(unit);
                true
            }
            TaskState::Staging | TaskState::Starting => false,
        }
    }
}

/// The soak's framework: partition-aware, one task per owed unit. Create one per driver over
/// the same [`Book`].
pub struct SoakFramework {
    pub spec: Arc<SoakSpec>,
    pub book: Arc<Mutex<Book>>,
}

impl SoakFramework {
    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn demand(&self, driver: &DriverHandle, owed: usize) {
        driver.set_demand(Some(Demand {
            task: self.spec.resources.clone(),
            count: owed as u32,
            gpu_model: None,
        }));
    }

    fn task(&self, unit: usize, attempt: usize) -> TaskInfo {
        let mut env = BTreeMap::new();
        env.insert("SOAK_UNIT".to_string(), unit.to_string());
        env.insert(
            "SOAK_SLEEP".to_string(),
            format!("{:.3}", self.spec.sleeps[unit].as_secs_f64()),
        );
        env.insert("GANTRY_SOAK_RUN".to_string(), self.spec.run_token.clone());
        TaskInfo {
            task_id: TaskId::random(),
            name: unit_name(unit, attempt),
            command: CommandInfo::shell(self.spec.command()),
            resources: self.spec.resources.clone(),
            env,
            kill_grace_secs: None,
            gpu_selector: None,
            container: None,
        }
    }
}

/// Releases the units below `limit` to the framework driven by `driver` (its demand updated,
/// offers revived).
pub fn release(book: &Mutex<Book>, spec: &SoakSpec, driver: &DriverHandle, limit: usize) {
    let launchable = {
        let mut b = book.lock().unwrap_or_else(|e| e.into_inner());
        b.limit = limit.min(b.unit_attempts.len());
        b.launchable()
    };
    driver.set_demand(Some(Demand {
        task: spec.resources.clone(),
        count: launchable as u32,
        gpu_model: None,
    }));
    driver.revive(vec![]);
}

/// The name of a unit's `attempt`-th task (`soak-u12-a0`: unit 12, first attempt).
pub fn unit_name(unit: usize, attempt: usize) -> String {
    format!("soak-u{unit}-a{attempt}")
}

impl Scheduler for SoakFramework {
    async fn registered(&mut self, driver: &DriverHandle, framework_id: FrameworkId) {
        let (owed, open) = {
            let mut b = self.book();
            b.registrations.push((Instant::now(), framework_id));
            (b.launchable(), b.open_tasks())
        };
        self.demand(driver, owed);
        driver.revive(vec![]);
        // What happened to our tasks while we were away (or before a failover): explicit, so a
        // task the master never heard of is answered LOST and launched again.
        if !open.is_empty() {
            driver.reconcile(open);
        }
    }

    async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
        let groups = gantry_sdk::placement::offers::group_offers(&offers);
        let mut b = self.book.lock().unwrap_or_else(|e| e.into_inner());
        for g in groups {
            let (ids, mut avail) = (g.offer_ids, g.resources);
            let mut tasks = Vec::new();
            while b.launchable() > 0 && avail.contains(&self.spec.resources) {
                let _ = avail.checked_sub_assign(&self.spec.resources);
                let Some(unit) = b.next_unit() else {
                    break;
                };
                let attempt = b.unit_attempts[unit].len();
                let t = self.task(unit, attempt);
                b.unit_attempts[unit].push(t.task_id);
                b.attempts.insert(
                    t.task_id,
                    Attempt {
                        unit,
                        name: t.name.clone(),
                        state: TaskState::Staging,
                        history: Vec::new(),
                    },
                );
                b.launched += 1;
                tasks.push(t);
            }
            if tasks.is_empty() {
                // Short: more work is released (or owed again) at any time.
                driver.decline(ids, Some(1.0));
            } else {
                let refuse = (b.launchable() > 0).then_some(0.0);
                driver.accept(ids, vec![Operation::Launch { tasks }], refuse);
            }
        }
        let owed = b.launchable();
        drop(b);
        self.demand(driver, owed);
    }

    async fn status_update(&mut self, driver: &DriverHandle, update: &StatusUpdate) {
        let (owe, owed) = {
            let mut b = self.book();
            (b.apply(update, Instant::now()), b.launchable())
        };
        if owe {
            self.demand(driver, owed);
            driver.revive(vec![]);
        }
    }

    async fn error(
        &mut self,
        _driver: &DriverHandle,
        kind: gantry_sdk::protocol::ErrorKind,
        message: &str,
    ) {
        let line = format!("{kind:?}: {message}");
        let mut b = self.book();
        // An accept that raced the offer's rescind (its agent went away, say): its tasks come
        // back DROPPED and are launched again. Anything else is the framework's or the
        // master's mistake.
        if kind == gantry_sdk::protocol::ErrorKind::UnknownOffer {
            b.offer_races.push(line);
        } else {
            b.anomalies.push(format!("framework error {line}"));
        }
    }
}

/// The ledger the tasks append to: `start UNIT TASK` and `done UNIT TASK` lines.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Lines per task id: (unit, starts, dones).
    pub tasks: BTreeMap<String, (usize, usize, usize)>,
    pub lines: usize,
    pub malformed: Vec<String>,
}

impl Ledger {
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        let mut l = Ledger::default();
        for line in text.lines() {
            l.lines += 1;
            let f: Vec<&str> = line.split_whitespace().collect();
            let unit = f.get(1).and_then(|u| u.parse::<usize>().ok());
            match (f.as_slice(), unit) {
                ([kind @ ("start" | "done"), _, task], Some(unit)) => {
                    let e = l.tasks.entry(task.to_string()).or_insert((unit, 0, 0));
                    if e.0 != unit {
                        l.malformed
                            .push(format!("{line} (task {task} was unit {})", e.0));
                    }
                    if *kind == "start" {
                        e.1 += 1;
                    } else {
                        e.2 += 1;
                    }
                }
                _ => l.malformed.push(line.to_string()),
            }
        }
        Ok(l)
    }

    /// Compares the ledger with the framework's book.
    pub fn reconcile(&self, book: &Book) -> Reconciled {
        let mut r = Reconciled {
            executions: self.tasks.values().map(|t| t.2).sum(),
            distinct_tasks: self.tasks.values().filter(|t| t.2 > 0).count(),
            ..Default::default()
        };
        for (task, &(unit, starts, dones)) in &self.tasks {
            if starts > 1 || dones > 1 {
                r.task_twice.push(format!(
                    "{task} (unit {unit}): {starts} starts, {dones} dones"
                ));
            }
            if dones > starts {
                r.inconsistent.push(format!("{task}: done without a start"));
            }
            if starts > dones {
                r.started_not_done.push(task.clone());
            }
            match task
                .parse::<TaskId>()
                .ok()
                .and_then(|t| book.attempts.get(&t))
            {
                None => r.unknown.push(task.clone()),
                Some(a) if a.state == TaskState::Dropped => r
                    .inconsistent
                    .push(format!("{task} ({}) ran but was DROPPED", a.name)),
                Some(a) if a.unit != unit => r
                    .inconsistent
                    .push(format!("{task} ({}) wrote unit {unit}", a.name)),
                Some(_) => {}
            }
        }
        for (&unit, task) in &book.finished {
            let ran = self.tasks.get(&task.to_string()).is_some_and(|t| t.2 >= 1);
            if !ran {
                r.never_executed
                    .push(format!("unit {unit}: task {task} FINISHED without running"));
            }
        }
        for unit in 0..book.unit_attempts.len() {
            if !book.finished.contains_key(&unit) {
                r.never_executed
                    .push(format!("unit {unit}: never FINISHED"));
            }
            let ran: Vec<TaskId> = book.unit_attempts[unit]
                .iter()
                .copied()
                .filter(|t| self.tasks.get(&t.to_string()).is_some_and(|e| e.2 > 0))
                .collect();
            if ran.len() > 1 {
                // Allowed only when every other attempt that ran was lost by the cluster (and so
                // launched again, as documented).
                let finished = book.finished.get(&unit).copied();
                let explained = ran.iter().filter(|t| Some(**t) != finished).all(|t| {
                    book.attempts
                        .get(t)
                        .is_some_and(|a| matches!(a.state, TaskState::Lost | TaskState::Gone))
                });
                let names: Vec<String> = ran
                    .iter()
                    .map(|t| {
                        let a = &book.attempts[t];
                        format!("{} {t} {}", a.name, a.state)
                    })
                    .collect();
                let line = format!("unit {unit}: {}", names.join(", "));
                if explained {
                    r.unit_twice_after_loss.push(line);
                } else {
                    r.unit_twice_unexplained.push(line);
                }
            }
        }
        r
    }
}

/// What [`Ledger::reconcile`] found.
#[derive(Debug, Default)]
pub struct Reconciled {
    /// `done` lines: units of work executed to the end.
    pub executions: usize,
    /// Task ids with a `done` line.
    pub distinct_tasks: usize,
    /// Task ids started or done more than once (Gantry never runs a task id twice).
    pub task_twice: Vec<String>,
    /// Units the framework considers finished with no `done` line of the FINISHED task, and
    /// units never finished.
    pub never_executed: Vec<String>,
    /// Units done by two tasks, the first lost by the cluster and so launched again (allowed).
    pub unit_twice_after_loss: Vec<String>,
    /// Units done by two tasks otherwise (not allowed).
    pub unit_twice_unexplained: Vec<String>,
    /// Tasks started and never done (killed mid-way).
    pub started_not_done: Vec<String>,
    /// Ledger task ids the framework never launched.
    pub unknown: Vec<String>,
    /// Anything else that does not add up.
    pub inconsistent: Vec<String>,
}

/// Live processes whose environment holds `GANTRY_SOAK_RUN=token` (task processes of this soak).
pub fn soak_processes(token: &str) -> Vec<(i32, String)> {
    let needle = format!("GANTRY_SOAK_RUN={token}");
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) && crate::process_alive(pid) {
            let cmd = std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            out.push((pid, cmd));
        }
    }
    out
}

/// What is left once the soak ended.
#[derive(Debug, Default)]
pub struct Leftovers {
    pub processes: Vec<String>,
    pub cgroups: Vec<String>,
    pub sandboxes: usize,
    /// Task ids with a `start` line (each made a sandbox).
    pub started: usize,
}

/// Distinct task ids with a `start` line.
pub fn started_tasks(ledger: &Ledger) -> BTreeSet<String> {
    ledger
        .tasks
        .iter()
        .filter(|(_, t)| t.1 > 0)
        .map(|(id, _)| id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_follows_the_seed_and_covers_every_kind() {
        let a = fault_schedule(&mut Rng::new(7), 12);
        let b = fault_schedule(&mut Rng::new(7), 12);
        assert_eq!(a, b);
        let first: BTreeSet<FaultKind> = a[..6].iter().copied().collect();
        assert_eq!(first.len(), 6, "{a:?}");
        assert_ne!(a, fault_schedule(&mut Rng::new(8), 12));
    }

    fn update(t: TaskId, state: TaskState, reconciliation: bool) -> StatusUpdate {
        StatusUpdate {
            reconciliation,
            ..StatusUpdate::new(t, FrameworkId::random(), state)
        }
    }

    #[test]
    fn the_ledger_names_what_ran_twice_and_what_never_ran() {
        let mut book = Book::new(3);
        let mut ids = Vec::new();
        for unit in 0..3 {
            let t = TaskId::random();
            book.unit_attempts[unit].push(t);
            book.attempts.insert(
                t,
                Attempt {
                    unit,
                    name: unit_name(unit, 0),
                    state: TaskState::Staging,
                    history: Vec::new(),
                },
            );
            ids.push(t);
        }
        book.owed.clear();
        let now = Instant::now();
        // Unit 0 lost, relaunched, and both attempts ran; unit 1 FINISHED without running;
        // unit 2 fine, but its FINISHED comes twice.
        assert!(book.apply(&update(ids[0], TaskState::Lost, false), now));
        let again = TaskId::random();
        book.unit_attempts[0].push(again);
        book.attempts.insert(
            again,
            Attempt {
                unit: 0,
                name: unit_name(0, 1),
                state: TaskState::Staging,
                history: Vec::new(),
            },
        );
        for t in [again, ids[1], ids[2]] {
            book.apply(&update(t, TaskState::Finished, false), now);
        }
        book.apply(&update(ids[2], TaskState::Finished, true), now);
        assert!(book.anomalies.is_empty(), "{:?}", book.anomalies);
        book.apply(&update(ids[2], TaskState::Finished, false), now);
        assert_eq!(book.anomalies.len(), 1);

        let dir = crate::TempDir::new("soak-ledger").unwrap();
        let path = dir.path().join("ledger");
        let mut text = String::new();
        for (unit, t) in [(0, ids[0]), (0, again), (2, ids[2])] {
            text.push_str(&format!("start {unit} {t}\ndone {unit} {t}\n"));
        }
        text.push_str(&format!("start 2 {}\n", ids[2]));
        std::fs::write(&path, text).unwrap();
        let r = Ledger::read(&path).unwrap().reconcile(&book);
        assert_eq!(r.executions, 3);
        assert_eq!(r.unit_twice_after_loss.len(), 1, "{r:?}");
        assert!(r.unit_twice_unexplained.is_empty());
        assert_eq!(r.never_executed.len(), 1, "{r:?}");
        assert!(r.never_executed[0].starts_with("unit 1:"));
        assert_eq!(r.task_twice.len(), 1, "{r:?}");
    }
}
