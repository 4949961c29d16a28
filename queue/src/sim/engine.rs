//! The queue's own policy on emulated agents: the [`Core`] driven through its public API
//! (`submit_as`, `offers`, `update`, `tick`, `rescinded`) with emulated instants, while this
//! module plays the master and the agents.
//!
//! The emulated master offers each agent's free resources (one offer per agent at a time, its
//! free GPUs listed), honours `Decline` filters (until their time or a `Revive`) and
//! `Suppress`, and rescinds an agent's outstanding offer when a task there ends so that a fresh
//! offer carries what was freed. Declined agents are offered again at the next step after their
//! filter (a submission, a task's end, or a tick): no step is made for a filter's expiry alone,
//! which in a waiting queue would tick the core every simulated second for nothing new (the
//! core declines for a second while jobs wait), and a submission lifts every filter. A `Launch` starts its tasks at once on the GPUs the core
//! pinned (or the first free ones) and reports them `RUNNING` with their GPUs. A worker ends
//! `FINISHED` when its job's remaining work is done; a `Kill`/`KillFor` ends it `KILLED` (with
//! the reason) after the job's grace period, or earlier if its work ends first. Work done
//! before a preemption is kept (the job resumes from its checkpoint). The core is ticked at
//! every event time (its statistics account each interval with the state it had) and at
//! least every `tick` seconds while jobs remain.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_sdk::protocol::*;

use super::report::{gang_fits, Outcome, Recorder, Report, Run};
use super::trace::{AgentGroup, TraceJob};
use super::SimOptions;
use crate::core::{Action, Core};
use crate::model::{JobSpec, JobState};

struct Agent {
    id: AgentId,
    hostname: String,
    gpus: Vec<GpuInfo>,
    busy: Vec<bool>,
    cpus: f64,
    mem: f64,
    cpus_used: f64,
    mem_used: f64,
    offer: Option<OfferId>,
    filtered_until: u64,
}

impl Agent {
    fn free_gpus(&self) -> u64 {
        self.busy.iter().filter(|b| !**b).count() as u64
    }
}

struct Task {
    id: TaskId,
    job: usize,
    agent: usize,
    gpus: Vec<usize>,
    cpus: f64,
    mem: f64,
    start: u64,
    natural_end: u64,
    kill: Option<(u64, Option<TaskReason>)>,
}

impl Task {
    fn end(&self) -> u64 {
        self.kill
            .map_or(self.natural_end, |(k, _)| k.min(self.natural_end))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Submit(usize),
    End(u64),
    Wake,
}

/// Per trace job, what the emulation keeps.
#[derive(Default, Clone)]
struct JobRun {
    core_id: u64,
    submitted: bool,
    live: u32,
    ended: bool,
    /// Work done in earlier attempts, ms.
    progress: u64,
    attempt_start: u64,
    preempted: bool,
}

/// Builds the emulated agents' GPUs.
pub(super) fn agents_of(cluster: &[AgentGroup]) -> Vec<(String, Vec<GpuInfo>, f64, f64)> {
    let mut out = Vec::new();
    for (g, group) in cluster.iter().enumerate() {
        for i in 0..group.count {
            let n = out.len();
            let gpus = (0..group.gpus)
                .map(|k| GpuInfo {
                    uuid: format!("GPU-sim-{n}-{k}"),
                    name: format!("NVIDIA {}", group.model),
                    memory_mib: 81920,
                    compute_capability: (9, 0),
                    minor: k,
                    pci_bus_id: format!("0000:{k:02x}:00.0"),
                    numa_node: Some(k / 4),
                    pci_root: None,
                    healthy: true,
                    mig_profile: None,
                    parent_uuid: None,
                })
                .collect();
            out.push((format!("sim-{g}-{i}"), gpus, group.cpus(), group.mem()));
        }
    }
    out
}

struct Sim<'a> {
    trace: &'a [TraceJob],
    opts: &'a SimOptions,
    core: Core,
    base: Instant,
    base_unix_ms: u64,
    framework: FrameworkId,
    agents: Vec<Agent>,
    offer_agent: HashMap<OfferId, usize>,
    tasks: BTreeMap<u64, Task>,
    by_task_id: HashMap<TaskId, u64>,
    next_task: u64,
    jobs: Vec<JobRun>,
    by_core_id: HashMap<u64, usize>,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    suppressed: bool,
    rec: Recorder,
    /// Whether the core's job views carry `estimated_start_unix_ms` (`None`: not yet known).
    eta_supported: Option<bool>,
    now: u64,
    last_launch: u64,
}

/// Runs the trace through the queue's core; returns its report.
pub fn run(trace: &[TraceJob], cluster: &[AgentGroup], opts: &SimOptions) -> Report {
    let agents: Vec<Agent> = agents_of(cluster)
        .into_iter()
        .map(|(hostname, gpus, cpus, mem)| Agent {
            id: AgentId::random(),
            hostname,
            busy: vec![false; gpus.len()],
            gpus,
            cpus,
            mem,
            cpus_used: 0.0,
            mem_used: 0.0,
            offer: None,
            filtered_until: 0,
        })
        .collect();
    let total_gpus = agents.iter().map(|a| a.gpus.len() as u64).sum();
    let mut sim = Sim {
        trace,
        opts,
        core: Core::new(crate::core::CoreConfig {
            // The emulated master has nothing in flight: no offer to wait for.
            offer_settle: std::time::Duration::ZERO,
            ..opts.core.clone()
        }),
        base: Instant::now(),
        base_unix_ms: opts.base_unix_ms,
        framework: FrameworkId::random(),
        agents,
        offer_agent: HashMap::new(),
        tasks: BTreeMap::new(),
        by_task_id: HashMap::new(),
        next_task: 0,
        jobs: vec![JobRun::default(); trace.len()],
        by_core_id: HashMap::new(),
        events: BinaryHeap::new(),
        seq: 0,
        suppressed: false,
        rec: Recorder::new(trace.len(), total_gpus),
        eta_supported: None,
        now: 0,
        last_launch: 0,
    };
    for (i, j) in trace.iter().enumerate() {
        sim.push(ms(j.submit), Ev::Submit(i));
    }
    sim.main_loop();
    let mut report = Report::build("queue", trace, &sim.rec, opts.buckets);
    report.queue_idle_while_eligible_gpu_secs = Some(sim.core.stats.idle_while_eligible_gpu_secs);
    report.reserved_idle_gpu_secs = Some(sim.core.stats.reserved_idle_gpu_secs);
    report
}

fn ms(secs: f64) -> u64 {
    (secs * 1000.0).round() as u64
}

fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

impl Sim<'_> {
    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, ev)));
    }

    fn instant(&self, at: u64) -> Instant {
        self.base + Duration::from_millis(at)
    }

    fn all_ended(&self) -> bool {
        self.jobs.iter().all(|j| j.ended)
    }

    fn main_loop(&mut self) {
        let tick = ms(self.opts.tick.max(0.001));
        let horizon = self.opts.horizon.map(ms);
        let mut next_tick = 0;
        loop {
            if self.all_ended() {
                break;
            }
            let next_event = self.events.peek().map(|Reverse((t, _, _))| *t);
            // While jobs remain, the core is ticked at least every `tick`; a queue where
            // nothing runs and nothing launched for a day of simulated time is stuck (jobs
            // that never fit): the run stops.
            let pending_work = !self.tasks.is_empty() || next_event.is_some();
            if !pending_work && self.now.saturating_sub(self.last_launch) > 86_400_000 {
                break;
            }
            let t = match next_event {
                Some(e) => e.min(next_tick.max(self.now)),
                None => next_tick.max(self.now),
            };
            if horizon.is_some_and(|h| t > h) {
                break;
            }
            self.now = t;
            self.rec.advance(secs(t));
            let now = self.instant(t);
            let actions = self.core.tick(now);
            self.perform(actions);
            if t >= next_tick {
                next_tick = t + tick;
            }
            while let Some(Reverse((at, _, ev))) = self.events.peek().copied() {
                if at > t {
                    break;
                }
                self.events.pop();
                match ev {
                    Ev::Submit(i) => self.submit(i),
                    Ev::End(handle) => self.end(handle, at),
                    Ev::Wake => {}
                }
            }
            self.offer_round();
            self.measure_idle();
        }
    }

    fn submit(&mut self, i: usize) {
        // Declined agents are offered again with the next step (the filters the core asks
        // for are a second or a few: a real master's next offer comes about as soon).
        for a in &mut self.agents {
            a.filtered_until = 0;
        }
        let j = &self.trace[i];
        let spec = JobSpec {
            name: j.name.clone(),
            team: j.team.clone(),
            priority: j.priority,
            command: vec!["true".into()],
            cpus: 1.0,
            mem: 256.0,
            gpus: crate::model::Gpus::whole(j.gpus),
            gpu_model: None,
            gpu_min_memory: None,
            min_workers: j.workers,
            max_workers: j.workers,
            deadline_unix: j.deadline.map(|d| (self.base_unix_ms + ms(d)) / 1000),
            grace_secs: self.opts.grace_secs,
            env: Default::default(),
            after: Vec::new(),
            max_retries: 0,
            time_limit_secs: j.time_limit.map(|l| l.ceil() as u64),
            deadline_best_effort: false,
            array: None,
            array_job: None,
            array_index: None,
        };
        let now = self.instant(self.now);
        let (id, actions) = self.core.submit_as(spec, j.user.clone(), now);
        self.jobs[i].core_id = id;
        self.jobs[i].submitted = true;
        self.by_core_id.insert(id, i);
        if self.eta_supported != Some(false) {
            let eta = self
                .core
                .view_at(id, now, self.base_unix_ms + self.now)
                .and_then(|v| serde_json::to_value(v).ok())
                .and_then(|v| v.get("estimated_start_unix_ms").cloned());
            match eta {
                None => self.eta_supported = Some(false),
                Some(v) => {
                    self.eta_supported = Some(true);
                    if let Some(at) = v.as_u64() {
                        self.rec.jobs[i].eta =
                            Some(at.saturating_sub(self.base_unix_ms) as f64 / 1000.0);
                    }
                }
            }
        }
        self.perform(actions);
    }

    /// Performs the core's actions (launches report `RUNNING` at once, which may bring more).
    fn perform(&mut self, actions: Vec<Action>) {
        let mut work: VecDeque<Action> = actions.into();
        while let Some(a) = work.pop_front() {
            match a {
                Action::Launch { offers, tasks } => {
                    let agent = offers.iter().find_map(|o| self.offer_agent.remove(o));
                    for o in &offers {
                        self.offer_agent.remove(o);
                    }
                    let Some(agent) = agent else {
                        // Offers not outstanding: the master drops the tasks.
                        for t in tasks {
                            let u =
                                StatusUpdate::new(t.task_id, self.framework, TaskState::Dropped);
                            let now = self.instant(self.now);
                            work.extend(self.core.update(&u, now));
                        }
                        continue;
                    };
                    self.agents[agent].offer = None;
                    for t in tasks {
                        work.extend(self.launch(agent, t));
                    }
                }
                Action::Decline(ids, secs_) => {
                    for o in ids {
                        if let Some(a) = self.offer_agent.remove(&o) {
                            let until = self.now + ms(secs_.max(0.0));
                            self.agents[a].offer = None;
                            self.agents[a].filtered_until = until;
                        }
                    }
                }
                Action::Kill(tid) => self.kill(tid, None),
                Action::KillFor(tid, reason) => self.kill(tid, Some(reason)),
                Action::Revive => {
                    self.suppressed = false;
                    for a in &mut self.agents {
                        a.filtered_until = 0;
                    }
                }
                Action::Suppress => self.suppressed = true,
            }
        }
    }

    fn launch(&mut self, agent: usize, t: TaskInfo) -> Vec<Action> {
        let now = self.instant(self.now);
        let Some(&job) = t
            .env
            .get("GPU_QUEUE_JOB_ID")
            .and_then(|id| id.parse::<u64>().ok())
            .and_then(|id| self.by_core_id.get(&id))
        else {
            let u = StatusUpdate::new(t.task_id, self.framework, TaskState::Dropped);
            return self.core.update(&u, now);
        };
        let want = t.resources.get("gpus").round() as usize;
        let a = &mut self.agents[agent];
        let pinned: Vec<usize> = t
            .gpu_selector
            .as_ref()
            .map(|s| {
                s.uuids
                    .iter()
                    .filter_map(|u| a.gpus.iter().position(|g| &g.uuid == u))
                    .filter(|i| !a.busy[*i])
                    .collect()
            })
            .unwrap_or_default();
        let gpus: Vec<usize> = if pinned.len() == want {
            pinned
        } else {
            (0..a.gpus.len())
                .filter(|i| !a.busy[*i])
                .take(want)
                .collect()
        };
        let cpus = t.resources.get("cpus");
        let mem = t.resources.get("mem");
        if gpus.len() < want
            || a.cpus_used + cpus > a.cpus + 1e-9
            || a.mem_used + mem > a.mem + 1e-9
        {
            let u = StatusUpdate {
                reason: Some(TaskReason::InvalidOffers),
                ..StatusUpdate::new(t.task_id, self.framework, TaskState::Dropped)
            };
            return self.core.update(&u, now);
        }
        for g in &gpus {
            a.busy[*g] = true;
        }
        a.cpus_used += cpus;
        a.mem_used += mem;
        let uuids: Vec<String> = gpus.iter().map(|g| a.gpus[*g].uuid.clone()).collect();
        let agent_id = a.id;
        if self.jobs[job].live == 0 {
            self.jobs[job].attempt_start = self.now;
            self.jobs[job].preempted = false;
            self.rec.started(job, secs(self.now));
            if let Some(limit) = self.trace[job].time_limit {
                let at = self.now + ms(limit.ceil());
                self.push(at, Ev::Wake);
            }
        }
        let run = &mut self.jobs[job];
        run.live += 1;
        let remaining = ms(self.trace[job].duration).saturating_sub(run.progress);
        let end = run.attempt_start + remaining;
        let handle = self.next_task;
        self.next_task += 1;
        self.tasks.insert(
            handle,
            Task {
                id: t.task_id,
                job,
                agent,
                gpus,
                cpus,
                mem,
                start: self.now,
                natural_end: end.max(self.now),
                kill: None,
            },
        );
        self.by_task_id.insert(t.task_id, handle);
        self.push(end.max(self.now), Ev::End(handle));
        self.last_launch = self.now;
        let u = StatusUpdate {
            gpus: uuids,
            agent_id: Some(agent_id),
            ..StatusUpdate::new(t.task_id, self.framework, TaskState::Running)
        };
        self.core.update(&u, now)
    }

    fn kill(&mut self, tid: TaskId, reason: Option<TaskReason>) {
        let Some(&handle) = self.by_task_id.get(&tid) else {
            return;
        };
        let grace = ms(f64::from(self.opts.grace_secs));
        let now = self.now;
        let Some(task) = self.tasks.get_mut(&handle) else {
            return;
        };
        if task.kill.is_some() {
            return;
        }
        task.kill = Some((now + grace, reason));
        if reason == Some(TaskReason::Preempted) {
            self.jobs[task.job].preempted = true;
        }
        let end = task.end();
        self.push(end, Ev::End(handle));
    }

    fn end(&mut self, handle: u64, at: u64) {
        if self.tasks.get(&handle).is_none_or(|t| t.end() != at) {
            return;
        }
        let Some(task) = self.tasks.remove(&handle) else {
            return;
        };
        self.by_task_id.remove(&task.id);
        let a = &mut self.agents[task.agent];
        for g in &task.gpus {
            a.busy[*g] = false;
        }
        a.cpus_used -= task.cpus;
        a.mem_used -= task.mem;
        a.filtered_until = 0;
        if let Some(o) = a.offer.take() {
            self.offer_agent.remove(&o);
            self.core.rescinded(o);
        }
        let job = task.job;
        self.rec.runs.push(Run {
            team: self.trace[job].team.clone(),
            gpus: task.gpus.len() as u64,
            start: secs(task.start),
            end: secs(at),
        });
        let killed = task.kill.filter(|(k, _)| *k < task.natural_end);
        let u = match killed {
            Some((_, reason)) => StatusUpdate {
                reason: Some(reason.unwrap_or(TaskReason::KilledByRequest)),
                ..StatusUpdate::new(task.id, self.framework, TaskState::Killed)
            },
            None => StatusUpdate::new(task.id, self.framework, TaskState::Finished),
        };
        let now = self.instant(at);
        let actions = self.core.update(&u, now);
        let run = &mut self.jobs[job];
        run.live -= 1;
        if run.live == 0 {
            run.progress += at - run.attempt_start;
            if std::mem::take(&mut run.preempted) {
                self.rec.jobs[job].preemptions += 1;
            }
        }
        let state = self.core.job_state(self.jobs[job].core_id);
        if self.jobs[job].live == 0 && state.is_none_or(JobState::is_terminal) {
            self.jobs[job].ended = true;
            let outcome = match state {
                Some(JobState::Finished) => Outcome::Finished,
                Some(JobState::Failed)
                    if task
                        .kill
                        .is_some_and(|k| k.1 == Some(TaskReason::TimeLimit)) =>
                {
                    Outcome::TimeLimit
                }
                _ => Outcome::Other,
            };
            self.rec.ended(job, secs(at), outcome);
        }
        self.perform(actions);
    }

    /// Offers every agent with free resources and no outstanding offer (not filtered, offers
    /// not suppressed), until the core launches nothing more.
    fn offer_round(&mut self) {
        for _ in 0..8 {
            if self.suppressed {
                return;
            }
            let launched_before = self.next_task;
            let mut batch = Vec::new();
            for (i, a) in self.agents.iter_mut().enumerate() {
                if a.offer.is_some() || a.filtered_until > self.now {
                    continue;
                }
                let cpus = a.cpus - a.cpus_used;
                let mem = a.mem - a.mem_used;
                if cpus < 0.001 || mem < 1.0 {
                    continue;
                }
                let free: Vec<GpuInfo> = a
                    .gpus
                    .iter()
                    .zip(&a.busy)
                    .filter(|(_, b)| !**b)
                    .map(|(g, _)| g.clone())
                    .collect();
                let id = OfferId::random();
                a.offer = Some(id);
                self.offer_agent.insert(id, i);
                batch.push(Offer {
                    id,
                    framework_id: self.framework,
                    agent_id: a.id,
                    hostname: a.hostname.clone(),
                    role: "default".into(),
                    resources: Resources::new()
                        .with("cpus", cpus)
                        .with("mem", mem)
                        .with("gpus", free.len() as f64),
                    reserved: Default::default(),
                    attributes: Default::default(),
                    gpus: Arc::from(free),
                    gpu_free: Vec::new(),
                    agent_name: a.hostname.clone(),
                });
            }
            if batch.is_empty() {
                return;
            }
            let now = self.instant(self.now);
            let actions = self.core.offers(batch, now);
            self.perform(actions);
            if self.next_task == launched_before {
                return;
            }
        }
    }

    /// Jobs that ended without running are recorded; the idle GPUs for the next interval: every free GPU while a waiting job's gang fits in
    /// what is free.
    fn measure_idle(&mut self) {
        let free: Vec<u64> = self.agents.iter().map(Agent::free_gpus).collect();
        let total: u64 = free.iter().sum();
        let mut shapes: Vec<(u32, u32)> = Vec::new();
        for (i, (r, t)) in self.jobs.iter_mut().zip(self.trace).enumerate() {
            if !r.submitted || r.ended || r.live > 0 {
                continue;
            }
            // Ended without running (cancelled: a deadline, say).
            if self
                .core
                .job_state(r.core_id)
                .is_none_or(JobState::is_terminal)
            {
                r.ended = true;
                self.rec.ended(i, secs(self.now), Outcome::Other);
                continue;
            }
            shapes.push((t.workers, t.gpus));
        }
        shapes.sort_unstable();
        shapes.dedup();
        let fits = total > 0 && shapes.iter().any(|(w, g)| gang_fits(&free, *w, *g));
        self.rec.idle_now = if fits { total } else { 0 };
    }
}
