//! Property tests of the pass on random event sequences: gangs are never partial nor over
//! their maximum and never beyond what was offered; and the incremental pass ([`Core::pass`])
//! decides exactly what the full pass it replaced decides (`pass_oracle`).

use std::collections::HashMap;

use proptest::prelude::*;

use super::tests::{gpus, spec, update};
use super::*;

#[derive(Debug, Clone)]
enum Ev {
    Submit {
        gpus: u32,
        min: u32,
        extra: u32,
        prio: u8,
    },
    Offer(usize),
    Finish(usize),
    Tick(u64),
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        (1u32..=8, 1u32..=3, 0u32..=1, 0u8..5).prop_map(|(gpus, min, extra, prio)| {
            Ev::Submit {
                gpus,
                min,
                extra,
                prio,
            }
        }),
        (0usize..3).prop_map(Ev::Offer),
        (0usize..8).prop_map(Ev::Finish),
        (0u64..90).prop_map(Ev::Tick),
    ]
}

/// A three-agent, 8-GPU cluster the core talks to, checking every action it returns.
struct Sim {
    agents: Vec<AgentId>,
    busy: Vec<Vec<bool>>,
    cpus_used: Vec<u64>,
    offered: HashMap<OfferId, usize>,
    running: BTreeMap<TaskId, (usize, Vec<usize>, String)>,
    jobs: HashMap<String, (u32, u32)>,
    alive: HashMap<String, u32>,
    now: Instant,
}

impl Sim {
    fn offer(&mut self, a: usize) -> Option<Offer> {
        if self.offered.values().any(|&x| x == a) {
            return None;
        }
        let free = self.busy[a].iter().filter(|b| !**b).count() as u64;
        let id = OfferId::random();
        self.offered.insert(id, a);
        Some(Offer {
            id,
            framework_id: FrameworkId::random(),
            agent_id: self.agents[a],
            hostname: format!("h{a}"),
            role: "default".into(),
            resources: format!("cpus:{};mem:65536;gpus:{free}", 64 - self.cpus_used[a])
                .parse()
                .unwrap(),
            reserved: Default::default(),
            attributes: Default::default(),
            gpus: gpus(a as u32).into(),
            gpu_free: Vec::new(),
            agent_name: "a".into(),
        })
    }

    /// Applies actions; returns the updates they cause. Panics (fails the property) on a
    /// launch the offers do not cover or a partial gang.
    fn apply(&mut self, actions: Vec<Action>) -> Vec<StatusUpdate> {
        let mut ups = Vec::new();
        let mut per_job: HashMap<String, (u32, u32)> = HashMap::new();
        for a in actions {
            match a {
                Action::Launch { offers, tasks } => {
                    let agents: BTreeSet<usize> = offers
                        .iter()
                        .map(|o| self.offered.remove(o).expect("unknown offer"))
                        .collect();
                    assert_eq!(agents.len(), 1, "an accept spans agents");
                    let a = *agents.iter().next().unwrap();
                    for t in tasks {
                        let k = (t.resources.milli("gpus") / 1000) as usize;
                        let free: Vec<usize> =
                            (0..8).filter(|&i| !self.busy[a][i]).take(k).collect();
                        assert_eq!(free.len(), k, "launch beyond the offer on h{a}");
                        assert!(self.cpus_used[a] < 64, "CPU over-commit");
                        for &i in &free {
                            self.busy[a][i] = true;
                        }
                        self.cpus_used[a] += 1;
                        let job = t.name.rsplit_once('/').unwrap().0.to_string();
                        let alive = self.alive.entry(job.clone()).or_default();
                        per_job.entry(job.clone()).or_insert((*alive, 0)).1 += 1;
                        *alive += 1;
                        let mut u = update(
                            &t,
                            TaskState::Running,
                            free.iter().map(|i| format!("GPU-{a}-{i}")).collect(),
                        );
                        u.agent_id = Some(self.agents[a]);
                        ups.push(u);
                        self.running.insert(t.task_id, (a, free, job));
                    }
                }
                Action::Decline(ids, _) => {
                    for id in ids {
                        self.offered.remove(&id);
                    }
                }
                Action::Kill(t) | Action::KillFor(t, _) => {
                    if let Some(u) = self.end(t, TaskState::Killed) {
                        ups.push(u);
                    }
                }
                Action::Revive | Action::Suppress => {}
            }
        }
        for (job, (before, n)) in per_job {
            let (min, max) = self.jobs[&job];
            assert!(
                before + n <= max,
                "{job}: {before} + {n} workers above max {max}"
            );
            assert!(
                before > 0 || n >= min,
                "partial gang {job}: {n} of min {min}"
            );
        }
        ups
    }

    fn end(&mut self, t: TaskId, state: TaskState) -> Option<StatusUpdate> {
        let (a, gpus, job) = self.running.remove(&t)?;
        for i in gpus {
            self.busy[a][i] = false;
        }
        self.cpus_used[a] -= 1;
        if let Some(n) = self.alive.get_mut(&job) {
            *n -= 1;
        }
        let mut u = update(
            &TaskInfo {
                task_id: t,
                name: String::new(),
                command: CommandInfo::shell("x"),
                resources: Resources::new(),
                env: Default::default(),
                kill_grace_secs: None,
                gpu_selector: None,
                container: None,
            },
            state,
            vec![],
        );
        u.agent_id = Some(self.agents[a]);
        Some(u)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever arrives in whatever order, the queue never launches a partial gang, never
    /// more than a gang's maximum, and never beyond what it was offered.
    #[test]
    fn never_a_partial_gang_or_an_over_commit(events in prop::collection::vec(ev(), 1..60)) {
        let mut q = Core::new(CoreConfig {
            aging: Duration::from_secs(60),
            ..Default::default()
        });
        let mut sim = Sim {
            agents: (0..3).map(|_| AgentId::random()).collect(),
            busy: vec![vec![false; 8]; 3],
            cpus_used: vec![0; 3],
            offered: HashMap::new(),
            running: BTreeMap::new(),
            jobs: HashMap::new(),
            alive: HashMap::new(),
            now: Instant::now(),
        };
        for (n, e) in events.into_iter().enumerate() {
            let actions = match e {
                Ev::Submit { gpus, min, extra, prio } => {
                    let name = format!("j{n}");
                    let mut s = spec(&name, ["a", "b"][n % 2], Priority::from_rank(prio), gpus, min);
                    s.max_workers = min + extra;
                    sim.jobs.insert(name, (min, min + extra));
                    q.submit(s, sim.now).1
                }
                Ev::Offer(a) => match sim.offer(a) {
                    Some(o) => q.offers(vec![o], sim.now),
                    None => Vec::new(),
                },
                Ev::Finish(k) => {
                    let t = sim.running.keys().nth(k).copied();
                    match t.and_then(|t| sim.end(t, TaskState::Finished)) {
                        Some(u) => q.update(&u, sim.now),
                        None => Vec::new(),
                    }
                }
                Ev::Tick(secs) => {
                    sim.now += Duration::from_secs(secs);
                    q.tick(sim.now)
                }
            };
            let mut ups = sim.apply(actions);
            while let Some(u) = ups.pop() {
                let more = q.update(&u, sim.now);
                ups.extend(sim.apply(more));
            }
        }
    }
}

/// One event of the oracle comparison.
#[derive(Debug, Clone)]
enum Op {
    Submit {
        gpus: u32,
        min: u32,
        extra: u32,
        prio: u8,
        team: usize,
        limit: Option<u64>,
        /// Seconds after the start (as Unix seconds from [`WALL0`]), and best-effort.
        deadline: Option<(u64, bool)>,
        /// A job it runs after (`afterok`; refused alike by both sides when unknown).
        after: Option<u64>,
    },
    Offer(usize),
    Finish(usize),
    Fail(usize),
    Cancel(u64),
    Tick(u64),
    /// A store commit ([`Core::take_changes`]: it takes the jobs touched since the last).
    Commit,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (
            (0u32..=8, 1u32..=3, 0u32..=2, 0u8..5, 0usize..3),
            prop::option::of(10u64..400),
            prop::option::weighted(0.3, (0u64..900, any::<bool>())),
            prop::option::weighted(0.2, 1u64..30),
        )
            .prop_map(
                |((gpus, min, extra, prio, team), limit, deadline, after)| Op::Submit {
                    gpus,
                    min,
                    extra,
                    prio,
                    team,
                    limit,
                    deadline,
                    after,
                },
            ),
        3 => (0usize..3).prop_map(Op::Offer),
        2 => (0usize..8).prop_map(Op::Finish),
        1 => (0usize..8).prop_map(Op::Fail),
        1 => (1u64..30).prop_map(Op::Cancel),
        2 => (0u64..120).prop_map(Op::Tick),
        2 => Just(Op::Commit),
    ]
}

/// A core and the cluster it talks to, with its task ids numbered in launch order (ids are
/// random: two cores are compared by these numbers).
struct Side {
    q: Core,
    sim: Sim,
    seq: HashMap<TaskId, usize>,
    /// When the sequence started (the wall clock is [`WALL0`] then).
    start: Instant,
}

/// The wall clock (Unix milliseconds) when a sequence starts.
const WALL0: u64 = 1_900_000_000_000;

impl Side {
    fn new(config: CoreConfig, oracle: bool, agents: &[AgentId], now: Instant) -> Side {
        let mut q = Core::new(config);
        q.oracle = oracle;
        Side {
            q,
            sim: Sim {
                agents: agents.to_vec(),
                busy: vec![vec![false; 8]; agents.len()],
                cpus_used: vec![0; agents.len()],
                offered: HashMap::new(),
                running: BTreeMap::new(),
                jobs: HashMap::new(),
                alive: HashMap::new(),
                now,
            },
            seq: HashMap::new(),
            start: now,
        }
    }

    fn number(&mut self, t: TaskId) -> usize {
        let n = self.seq.len();
        *self.seq.entry(t).or_insert(n)
    }

    /// The actions with offers named by agent and tasks by number.
    fn normalize(&mut self, actions: &[Action]) -> Vec<String> {
        let mut out = Vec::new();
        for a in actions {
            out.push(match a {
                Action::Launch { offers, tasks } => {
                    let at: Vec<Option<usize>> = offers
                        .iter()
                        .map(|o| self.sim.offered.get(o).copied())
                        .collect();
                    let tasks: Vec<String> = tasks
                        .iter()
                        .map(|t| {
                            format!(
                                "{} {} {:?} {:?} {:?}",
                                self.number(t.task_id),
                                t.name,
                                t.resources,
                                t.env,
                                t.gpu_selector
                            )
                        })
                        .collect();
                    format!("launch {at:?} {tasks:?}")
                }
                Action::Decline(ids, secs) => {
                    let mut at: Vec<Option<usize>> = ids
                        .iter()
                        .map(|o| self.sim.offered.get(o).copied())
                        .collect();
                    at.sort();
                    format!("decline {at:?} {secs}")
                }
                Action::Kill(t) => format!("kill {}", self.number(*t)),
                Action::KillFor(t, why) => format!("kill {} {why:?}", self.number(*t)),
                other => format!("{other:?}"),
            });
        }
        out
    }

    /// Gives the core the wall clock at `now`: [`WALL0`] at the start.
    fn wall(&mut self, now: Instant) {
        let ms = now.saturating_duration_since(self.start).as_millis() as u64;
        self.q.set_wall_clock(now, WALL0 + ms);
    }

    /// The `k`-th running task by launch number.
    fn running(&self, k: usize) -> Option<TaskId> {
        let mut ids: Vec<(usize, TaskId)> = self
            .sim
            .running
            .keys()
            .map(|t| (self.seq.get(t).copied().unwrap_or(usize::MAX), *t))
            .collect();
        ids.sort();
        ids.get(k).map(|e| e.1)
    }

    /// Runs one event; returns every action it caused (updates from launches and kills
    /// answered at once), normalized.
    fn run(&mut self, n: usize, op: &Op) -> Vec<String> {
        let now = self.sim.now;
        self.wall(now);
        let actions = match op {
            Op::Submit {
                gpus,
                min,
                extra,
                prio,
                team,
                limit,
                deadline,
                after,
            } => {
                let name = format!("j{n}");
                let mut s = spec(
                    &name,
                    ["a", "b", "c"][*team],
                    Priority::from_rank(*prio),
                    *gpus,
                    *min,
                );
                s.max_workers = min + extra;
                s.time_limit_secs = *limit;
                if let Some((secs, best_effort)) = deadline {
                    s.deadline_unix = Some(WALL0 / 1000 + secs);
                    s.deadline_best_effort = *best_effort;
                }
                // Every third job retries once after a failure (a backoff: not eligible
                // meanwhile).
                s.max_retries = u32::from(n.is_multiple_of(3));
                s.after = after.iter().copied().collect();
                self.sim.jobs.insert(name, (*min, min + extra));
                self.q.submit(s, now).1
            }
            Op::Offer(a) => match self.sim.offer(*a) {
                Some(o) => self.q.offers(vec![o], now),
                None => Vec::new(),
            },
            Op::Finish(k) | Op::Fail(k) => {
                let state = if matches!(op, Op::Fail(_)) {
                    TaskState::Failed
                } else {
                    TaskState::Finished
                };
                match self.running(*k).and_then(|t| self.sim.end(t, state)) {
                    Some(u) => self.q.update(&u, now),
                    None => Vec::new(),
                }
            }
            Op::Cancel(id) => self.q.cancel(*id, now).unwrap_or_default(),
            Op::Tick(secs) => {
                self.sim.now += Duration::from_secs(*secs);
                self.wall(self.sim.now);
                self.q.tick(self.sim.now)
            }
            Op::Commit => {
                let ms = now.saturating_duration_since(self.start).as_millis() as u64;
                self.q.take_changes(now, WALL0 + ms);
                Vec::new()
            }
        };
        let mut seen = self.normalize(&actions);
        let mut ups = self.sim.apply(actions);
        while let Some(u) = ups.pop() {
            let more = self.q.update(&u, self.sim.now);
            seen.extend(self.normalize(&more));
            ups.extend(self.sim.apply(more));
        }
        seen
    }

    /// What the API shows of every job (members without their random task ids), the order of
    /// the pending ones, the statistics, the reservation and holds, the preemption under way.
    fn state(&self) -> String {
        let now = self.sim.now;
        let views: Vec<String> = self
            .q
            .views(now)
            .into_iter()
            .map(|mut v| {
                v.members.clear();
                serde_json::to_string(&v).unwrap()
            })
            .collect();
        let s = &self.q.stats;
        format!(
            "{views:?} {:?} {:?} {:?} {:?} {:?}",
            self.q.order(now),
            (
                s.preemptions,
                s.idle_while_eligible_gpu_secs,
                s.reserved_idle_gpu_secs,
                s.settling_idle_gpu_secs
            ),
            self.q
                .last_reservation
                .as_ref()
                .map(|r| (r.holder, &r.parts, r.start)),
            self.q.holds.holder(),
            self.q.preempt_for,
        )
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// The incremental pass decides exactly what the full pass decides: the same actions
    /// after every event, and the same jobs, order and reservations, on random queues (gangs,
    /// elastic gangs, CPU-only jobs, time limits for EASY backfill, priorities that preempt,
    /// teams with quotas, fair-share wait, failures, cancels, deadlines (strict and
    /// best-effort: urgency raises a job's class), retries after a backoff, store commits
    /// (which take the touched jobs the kept order also reads) and time jumps across aging
    /// steps (60 s)). Without quotas the pass takes its order, eligible jobs and least worker
    /// from what is kept across passes (`order_cache`, updated from touched and due jobs),
    /// which must match the oracle's full keying and walk after every pass.
    #[test]
    fn the_incremental_pass_decides_what_the_full_pass_decides(
        ops in prop::collection::vec(op(), 1..80),
        quotas in any::<bool>(),
        fair in any::<bool>(),
    ) {
        let mut teams = BTreeMap::new();
        if quotas {
            for (t, q) in [("a", 8), ("b", 4)] {
                teams.insert(t.to_string(), TeamConfig { gpu_quota: Some(q), ..Default::default() });
            }
        }
        let config = CoreConfig {
            aging: Duration::from_secs(60),
            teams,
            fair_share_wait: fair.then_some(Duration::from_secs(30)),
            ..Default::default()
        };
        let agents: Vec<AgentId> = (0..3).map(|_| AgentId::random()).collect();
        let now = Instant::now();
        let mut new = Side::new(config.clone(), false, &agents, now);
        let mut old = Side::new(config, true, &agents, now);
        for (n, op) in ops.iter().enumerate() {
            let (a, b) = (new.run(n, op), old.run(n, op));
            prop_assert_eq!(a, b, "event {} {:?}", n, op);
            prop_assert_eq!(new.state(), old.state(), "after event {} {:?}", n, op);
        }
    }
}
