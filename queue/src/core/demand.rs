//! What the queue declares to the master (`DriverHandle::set_demand`, demand-aware offers):
//! its eligible pending jobs' workers, grouped by shape. The master offers tasks' worth of
//! each shape, and `GET /api/v1/demand` shows what the fleet cannot place, which an autoscaler
//! (`gantry-autoscaler`) scales for.
//!
//! A shape is one worker's resources (CPUs, memory, whole GPUs) and the GPU model its job asks
//! for (`--gpu-model`, declared as the protocol's `Demand::gpu_model`, protocol 11); its count
//! is the workers of every eligible pending job of that shape (`max_workers` each: what the queue launches when
//! there is room). Jobs waiting for a dependency or a retry's backoff, running jobs and ended
//! ones declare nothing. Shapes are ordered by the highest priority among their jobs, then by
//! their oldest job, and at most [`MAX_DEMAND_SHAPES`] are declared (the most urgent). The
//! GPU memory a job asks for (`--gpu-min-memory`) is not declared: jobs differing only in it
//! share a shape.

use std::collections::BTreeMap;

use gantry_sdk::protocol::{Demand, MAX_DEMAND_SHAPES};

use super::{member_resources, Core};
use crate::model::{JobSpec, Priority};

/// One shape's jobs so far: the highest priority, the oldest job's id, the workers, and the
/// oldest job's specification (its resources are the shape's).
type Tally<'a> = (Priority, u64, u64, &'a JobSpec);

/// The demand of `pending` jobs (each with its id, in any order): shapes with counts, in
/// declaration order (see the module docs).
pub fn shapes<'a>(pending: impl IntoIterator<Item = (u64, &'a JobSpec)>) -> Vec<Demand> {
    // Key: (cpus, mem, gpus) in thousandths, exact as the resources the workers launch with,
    // and the GPU model asked for.
    type Key<'a> = (u64, u64, u64, Option<&'a str>);
    let mut by_shape: BTreeMap<Key<'a>, Tally<'a>> = BTreeMap::new();
    for (id, spec) in pending {
        let workers = u64::from(spec.max_workers.max(spec.min_workers).max(1));
        let res = member_resources(spec);
        let model = spec
            .gpu_model
            .as_deref()
            .map(str::trim)
            .filter(|m| !m.is_empty() && !spec.gpus.is_zero());
        let key = (
            res.milli("cpus"),
            res.milli("mem"),
            spec.gpus.milli(),
            model,
        );
        let e = by_shape.entry(key).or_insert((spec.priority, id, 0, spec));
        e.0 = e.0.max(spec.priority);
        if id < e.1 {
            e.1 = id;
            e.3 = spec;
        }
        e.2 += workers;
    }
    let mut out: Vec<(Priority, u64, Demand)> = by_shape
        .into_iter()
        .map(|((.., model), (prio, first, count, spec))| {
            let demand = Demand {
                task: member_resources(spec),
                count: u32::try_from(count).unwrap_or(u32::MAX),
                gpu_model: model.map(str::to_string),
            };
            (prio, first, demand)
        })
        .collect();
    out.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    out.truncate(MAX_DEMAND_SHAPES);
    out.into_iter().map(|(_, _, d)| d).collect()
}

impl Core {
    /// The demand to declare now: the eligible pending jobs' worker shapes with their counts,
    /// at most 16, the most urgent first (see docs/queue.md, "Demand").
    pub fn demand(&self) -> Vec<Demand> {
        shapes(
            self.jobs
                .values()
                .filter(|j| Self::eligible(j))
                .map(|j| (j.id, &j.spec)),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::core::tests::spec;
    use crate::core::CoreConfig;

    fn shape(d: &Demand) -> (f64, f64, f64, u32) {
        (
            d.task.get("cpus"),
            d.task.get("mem"),
            d.task.get("gpus"),
            d.count,
        )
    }

    #[test]
    fn workers_of_one_shape_add_up_and_shapes_go_by_priority_then_age() {
        let a = spec("a", "nlp", Priority::Normal, 1, 1);
        let gang = spec("g", "nlp", Priority::Normal, 8, 2);
        let b = spec("b", "cv", Priority::Low, 1, 3);
        let mut urgent = spec("u", "cv", Priority::Critical, 2, 1);
        urgent.cpus = 4.0;
        urgent.mem = 4096.0;
        let d = shapes([(1, &a), (2, &gang), (3, &b), (4, &urgent)]);
        let got: Vec<_> = d.iter().map(shape).collect();
        assert_eq!(
            got,
            [
                (4.0, 4096.0, 2.0, 1),
                (1.0, 64.0, 1.0, 4),
                (1.0, 64.0, 8.0, 2),
            ]
        );
    }

    #[test]
    fn jobs_differing_in_gpu_model_declare_shapes_of_their_model() {
        let any = spec("any", "nlp", Priority::Normal, 1, 2);
        let mut h100 = spec("h", "nlp", Priority::Normal, 1, 1);
        h100.gpu_model = Some("H100".into());
        let mut h100b = h100.clone();
        h100b.min_workers = 3;
        h100b.max_workers = 3;
        let mut cpu = spec("c", "nlp", Priority::Normal, 0, 1);
        cpu.gpu_model = Some("H100".into());
        let d = shapes([(1, &any), (2, &h100), (3, &h100b), (4, &cpu)]);
        let got: Vec<(f64, Option<&str>, u32)> = d
            .iter()
            .map(|d| (d.task.get("gpus"), d.gpu_model.as_deref(), d.count))
            .collect();
        // A job without GPUs declares no model.
        assert_eq!(
            got,
            [(1.0, None, 2), (1.0, Some("H100"), 4), (0.0, None, 1)]
        );
    }

    #[test]
    fn an_elastic_job_declares_its_most_workers() {
        let mut e = spec("e", "nlp", Priority::Normal, 1, 2);
        e.max_workers = 5;
        assert_eq!(shape(&shapes([(1, &e)])[0]).3, 5);
    }

    #[test]
    fn at_most_sixteen_shapes_the_most_urgent_kept() {
        let specs: Vec<JobSpec> = (1..=20)
            .map(|i| {
                let prio = if i > 16 {
                    Priority::High
                } else {
                    Priority::Normal
                };
                spec("s", "nlp", prio, i, 1)
            })
            .collect();
        let d = shapes(specs.iter().enumerate().map(|(i, s)| (i as u64 + 1, s)));
        assert_eq!(d.len(), MAX_DEMAND_SHAPES);
        let gpus: Vec<f64> = d.iter().map(|d| d.task.get("gpus")).collect();
        // The four high-priority shapes first, then the oldest normal ones.
        assert_eq!(&gpus[..5], [17.0, 18.0, 19.0, 20.0, 1.0]);
        assert_eq!(gpus[15], 12.0);
    }

    #[test]
    fn only_eligible_pending_jobs_declare_and_none_is_empty() {
        let mut core = Core::new(CoreConfig::default());
        let now = Instant::now();
        assert!(core.demand().is_empty());
        let (first, _) = core.submit(spec("a", "nlp", Priority::Normal, 2, 2), now);
        let mut dep = spec("b", "nlp", Priority::Normal, 1, 1);
        dep.after = vec![first];
        core.submit(dep, now + Duration::from_millis(1));
        // The dependent job is not eligible yet.
        let got: Vec<_> = core.demand().iter().map(shape).collect();
        assert_eq!(got, [(1.0, 64.0, 2.0, 2)]);
        core.cancel(first, now).unwrap();
        core.pass(now);
        // Cancelled; its dependent cancelled with it: nothing left to declare.
        assert!(core.demand().is_empty(), "{:?}", core.demand());
    }
}
