//! Baselines for comparison only, on the same emulated cluster (GPU counts per agent), with no
//! preemption: **FIFO** (jobs start in submission order; the first that does not fit blocks
//! every later one) and **EASY** (Slurm-like: jobs ordered by priority class, then
//! submission; the first that does not fit gets a reservation at the earliest time enough GPUs
//! free up, judged by the running jobs' time limits; a later job may start now if it fits and
//! either ends (by its time limit) before that time or leaves the reservation's GPUs alone).
//! A gang's workers are placed best-fit, one agent per worker. Time limits are enforced as in
//! the queue: the job is killed at its limit and ends after the grace period.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::report::{gang_fits, Outcome, Recorder, Report, Run};
use super::trace::{AgentGroup, TraceJob};
use super::SimOptions;

/// A baseline policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// Strict first come, first served.
    Fifo,
    /// Priority, then EASY backfill.
    Easy,
}

impl Baseline {
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Baseline::Fifo => "fifo",
            Baseline::Easy => "easy",
        }
    }
}

/// Best-fit placement of `workers` × `gpus` on free counts: per worker the agent with the
/// fewest free GPUs that still hold it. `None` when the gang does not fit.
pub fn place(free: &[u64], workers: u32, gpus: u32) -> Option<Vec<usize>> {
    let mut free = free.to_vec();
    let need = u64::from(gpus);
    let mut out = Vec::with_capacity(workers as usize);
    for _ in 0..workers {
        let (i, _) = free
            .iter()
            .enumerate()
            .filter(|(_, f)| **f >= need)
            .min_by_key(|(i, f)| (**f, *i))?;
        free[i] -= need;
        out.push(i);
    }
    Some(out)
}

struct Running {
    job: usize,
    agents: Vec<usize>,
    start: u64,
    end: u64,
    /// Expected end by its time limit (`u64::MAX`: no limit).
    limit_end: u64,
    time_limited: bool,
}

fn ms(secs: f64) -> u64 {
    (secs * 1000.0).round() as u64
}

fn secs(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// Runs the trace under a baseline; returns its report.
pub fn run(
    policy: Baseline,
    trace: &[TraceJob],
    cluster: &[AgentGroup],
    opts: &SimOptions,
) -> Report {
    let mut free: Vec<u64> = cluster
        .iter()
        .flat_map(|g| std::iter::repeat_n(u64::from(g.gpus), g.count as usize))
        .collect();
    let total: u64 = free.iter().sum();
    let mut rec = Recorder::new(trace.len(), total);
    let grace = ms(f64::from(opts.grace_secs));
    let mut queue: Vec<usize> = Vec::new();
    let mut running: Vec<Running> = Vec::new();
    // (time, kind 0 end / 1 submit, index)
    let mut events: BinaryHeap<Reverse<(u64, u8, usize)>> = trace
        .iter()
        .enumerate()
        .map(|(i, j)| Reverse((ms(j.submit), 1, i)))
        .collect();
    let horizon = opts.horizon.map(ms);
    // Jobs that no agent set can ever hold are left out (unfinished), as the queue refuses them.
    let capacity = free.clone();
    while let Some(Reverse((t, _, _))) = events.peek().copied() {
        if horizon.is_some_and(|h| t > h) {
            break;
        }
        rec.advance(secs(t));
        while let Some(Reverse((at, kind, i))) = events.peek().copied() {
            if at > t {
                break;
            }
            events.pop();
            if kind == 1 {
                if place(&capacity, trace[i].workers, trace[i].gpus).is_some() {
                    queue.push(i);
                }
                continue;
            }
            let Some(pos) = running.iter().position(|r| r.job == i && r.end == at) else {
                continue;
            };
            let r = running.swap_remove(pos);
            for a in &r.agents {
                free[*a] += u64::from(trace[i].gpus);
                rec.runs.push(Run {
                    team: trace[i].team.clone(),
                    gpus: u64::from(trace[i].gpus),
                    start: secs(r.start),
                    end: secs(at),
                });
            }
            let outcome = if r.time_limited {
                Outcome::TimeLimit
            } else {
                Outcome::Finished
            };
            rec.ended(i, secs(at), outcome);
        }
        if policy == Baseline::Easy {
            queue.sort_by_key(|i| (Reverse(trace[*i].priority), ms(trace[*i].submit), *i));
        }
        let started = schedule(policy, trace, &queue, &mut free, &running, t);
        for (i, agents) in started {
            queue.retain(|q| *q != i);
            let j = &trace[i];
            let natural = t + ms(j.duration);
            let limit = j.time_limit.map(|l| t + ms(l.ceil()));
            let (end, time_limited) = match limit {
                Some(l) if l < natural => ((l + grace).min(natural), l + grace < natural),
                _ => (natural, false),
            };
            rec.started(i, secs(t));
            running.push(Running {
                job: i,
                agents,
                start: t,
                end,
                limit_end: limit.unwrap_or(u64::MAX),
                time_limited,
            });
            events.push(Reverse((end, 0, i)));
        }
        let fits = queue
            .iter()
            .any(|i| gang_fits(&free, trace[*i].workers, trace[*i].gpus));
        rec.idle_now = if fits { free.iter().sum() } else { 0 };
    }
    Report::build(policy.name(), trace, &rec, opts.buckets)
}

/// The jobs to start now (with their agents), in order; `free` is updated.
fn schedule(
    policy: Baseline,
    trace: &[TraceJob],
    queue: &[usize],
    free: &mut [u64],
    running: &[Running],
    now: u64,
) -> Vec<(usize, Vec<usize>)> {
    let mut out = Vec::new();
    // The reservation: its start (shadow time) and the free GPUs projected then, less what
    // backfilled jobs running past it take.
    let mut shadow: Option<(u64, Vec<u64>, usize)> = None;
    for &i in queue {
        let j = &trace[i];
        match &mut shadow {
            None => {
                if let Some(agents) = place(free, j.workers, j.gpus) {
                    for a in &agents {
                        free[*a] -= u64::from(j.gpus);
                    }
                    out.push((i, agents));
                    continue;
                }
                if policy == Baseline::Fifo {
                    break;
                }
                shadow = Some(reservation(trace, i, free, running, &out, now));
            }
            Some((at, projected, head)) => {
                let Some(agents) = place(free, j.workers, j.gpus) else {
                    continue;
                };
                let ends = j.time_limit.map_or(u64::MAX, |l| now + ms(l.ceil()));
                if ends > *at {
                    // Runs past the reservation: only if the holder still fits without it.
                    let mut after = projected.clone();
                    for a in &agents {
                        after[*a] = after[*a].saturating_sub(u64::from(j.gpus));
                    }
                    let h = &trace[*head];
                    if place(&after, h.workers, h.gpus).is_none() {
                        continue;
                    }
                    *projected = after;
                }
                for a in &agents {
                    free[*a] -= u64::from(j.gpus);
                }
                out.push((i, agents));
            }
        }
    }
    out
}

/// When `head` can start (running jobs ending by their time limits, earliest first) and the
/// free GPUs then.
fn reservation(
    trace: &[TraceJob],
    head: usize,
    free: &[u64],
    running: &[Running],
    started: &[(usize, Vec<usize>)],
    now: u64,
) -> (u64, Vec<u64>, usize) {
    let mut ends: Vec<(u64, &[usize], u32)> = running
        .iter()
        .map(|r| (r.limit_end, r.agents.as_slice(), trace[r.job].gpus))
        .chain(started.iter().map(|(i, a)| {
            let end = trace[*i]
                .time_limit
                .map_or(u64::MAX, |l| now + ms(l.ceil()));
            (end, a.as_slice(), trace[*i].gpus)
        }))
        .collect();
    ends.sort_by_key(|e| e.0);
    let mut projected = free.to_vec();
    let h = &trace[head];
    for (end, agents, gpus) in ends {
        if end == u64::MAX {
            break;
        }
        for a in agents {
            projected[*a] += u64::from(gpus);
        }
        if place(&projected, h.workers, h.gpus).is_some() {
            return (end.max(now), projected, head);
        }
    }
    (u64::MAX, projected, head)
}
