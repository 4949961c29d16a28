//! Estimated start times (as `squeue --start`): the queue simulated forward with time limits.
//! Running workers end at their attempt's launch plus their job's time limit; each eligible
//! job, in scheduling order, starts at the earliest time its gang's fewest workers fit for
//! their whole time limit beside everything placed before it, and then occupies what it took
//! until its limit ends. A job that fits only once a job without a time limit ends (or behind
//! one that never fits) has no estimate, and so has one that fits at none of its first
//! [`MAX_START_TIMES`] candidate times, or is past the first [`MAX_ESTIMATED`] jobs.

use std::collections::HashMap;
use std::time::Instant;

use gantry_sdk::placement::gang::{self, GangRequest};
use gantry_sdk::protocol::*;

use super::{gang_of, member_resources, remove, time_limit, Core};

/// Jobs estimated per listing at most (the first in scheduling order); later ones have no
/// estimate. With [`MAX_START_TIMES`], bounds the cost of a listing of a very long queue on a
/// large cluster (the core is locked meanwhile).
pub const MAX_ESTIMATED: usize = 100;

/// Candidate start times tried per job at most (the earliest: now and the next ends and
/// starts); a job that fits at none of them has no estimate.
pub const MAX_START_TIMES: usize = 32;

/// Resources in use over `[start, end)` (`end` `None`: until further notice).
struct Busy {
    agent: AgentId,
    res: Resources,
    gpus: Vec<String>,
    start: Instant,
    end: Option<Instant>,
}

impl Core {
    /// Per eligible job among the first [`MAX_ESTIMATED`] of `order`: when it is expected to
    /// start (see the module documentation).
    pub(super) fn estimated_starts(&self, now: Instant, order: &[u64]) -> HashMap<u64, Instant> {
        let mut base = self.eventual_views(true);
        base.sort_by(|a, b| (&a.hostname, a.agent_id).cmp(&(&b.hostname, b.agent_id)));
        let mut busy: Vec<Busy> = self
            .member_ends(now)
            .into_iter()
            .map(|(agent, res, gpus, end)| Busy {
                agent,
                res,
                gpus,
                start: now,
                end,
            })
            .collect();
        let mut out = HashMap::new();
        for id in order.iter().take(MAX_ESTIMATED) {
            let Some(job) = self.jobs.get(id) else {
                continue;
            };
            let gang = GangRequest {
                max: job.spec.min_workers.max(1),
                ..gang_of(&job.spec)
            };
            let limit = time_limit(&self.config, &job.spec);
            let earliest = job.not_before.map_or(now, |t| t.max(now));
            let mut times: Vec<Instant> = busy
                .iter()
                .filter_map(|b| b.end)
                .chain(busy.iter().map(|b| b.start))
                .filter(|t| *t >= earliest)
                .collect();
            times.push(earliest);
            times.sort();
            times.dedup();
            times.truncate(MAX_START_TIMES);
            for t in times {
                let until = limit.map(|l| t + l);
                let mut views = base.clone();
                for b in &busy {
                    let starts_before = until.is_none_or(|u| b.start < u);
                    let ends_after = b.end.is_none_or(|e| e > t);
                    if starts_before && ends_after {
                        remove(&mut views, b.agent, &b.res, &b.gpus);
                    }
                }
                let Some(plan) = gang::place_gang(&mut views.clone(), &gang) else {
                    continue;
                };
                out.insert(*id, t);
                let res = member_resources(&job.spec);
                for a in plan.assignments {
                    busy.push(Busy {
                        agent: views[a.agent].agent_id,
                        res: res.clone(),
                        gpus: a.gpus,
                        start: t,
                        end: until,
                    });
                }
                break;
            }
        }
        out
    }
}
