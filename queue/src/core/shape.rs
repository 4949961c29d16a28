//! Gang shapes, for placing once per shape rather than once per job ([`Shape`],
//! [`ShapeCache`]), and the least worker of the eligible jobs ([`Least`]): the bound that lets
//! a pass stop once no offered agent could host any of them.

use gantry_sdk::placement::gang;
use gantry_sdk::placement::offers::AgentView;
use gantry_sdk::protocol::*;

use super::reserve::{gang_of, Parts};
use super::JobSpec;
use crate::model::Gpus;

/// A gang's shape: what placement depends on (a job's resources per worker, GPU selector and
/// worker counts), compared without building the request.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Shape {
    cpus: u64,
    mem: u64,
    gpus: Gpus,
    model: Option<String>,
    min_memory: Option<u64>,
    pub(super) min: u32,
    pub(super) max: u32,
}

impl Shape {
    pub(super) fn of(spec: &JobSpec) -> Shape {
        let min = spec.min_workers.max(1);
        Shape {
            cpus: spec.cpus.to_bits(),
            mem: spec.mem.to_bits(),
            gpus: spec.gpus,
            model: spec.gpu_model.clone(),
            min_memory: spec.gpu_min_memory,
            min,
            max: spec.max_workers.max(min),
        }
    }
}

/// Whether each gang shape fits some views, placed once per shape.
#[derive(Default)]
pub(super) struct ShapeCache {
    known: Vec<(Shape, bool)>,
}

impl ShapeCache {
    pub(super) fn fits(&mut self, views: &[AgentView], spec: &JobSpec) -> bool {
        let shape = Shape::of(spec);
        if let Some((_, fits)) = self.known.iter().find(|(s, _)| *s == shape) {
            return *fits;
        }
        let fits = gang::place_gang(&mut views.to_vec(), &gang_of(spec)).is_some();
        self.known.push((shape, fits));
        fits
    }
}

/// The least worker of the eligible jobs, resource by resource: a job's worker fits an agent
/// only where it has at least its CPUs, memory and GPUs, so an agent without this much of
/// each hosts none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Least {
    cpus: f64,
    mem: f64,
    gpus: Gpus,
}

impl Least {
    /// Nothing yet (no job): fits nowhere.
    pub(super) const NONE: Least = Least {
        cpus: f64::INFINITY,
        mem: f64::INFINITY,
        gpus: Gpus::from_milli(u32::MAX),
    };

    /// Counts `spec`'s worker in (amounts the milli-unit conversion might not take count as
    /// nothing: the bound only ever errs low).
    pub(super) fn add(&mut self, spec: &JobSpec) {
        let (cpus, mem, gpus) = Self::parts(spec);
        self.add_parts(f64::from_bits(cpus), f64::from_bits(mem), gpus);
    }

    /// What [`Least::add`] counts of `spec`'s worker: its CPUs and memory (as bits, so that
    /// the triple can key a map) and GPUs.
    pub(super) fn parts(spec: &JobSpec) -> (u64, u64, Gpus) {
        let amount = |v: f64| {
            if v.is_finite() && v > 0.0 && v < 1e12 {
                v
            } else {
                0.0
            }
        };
        (
            amount(spec.cpus).to_bits(),
            amount(spec.mem).to_bits(),
            spec.gpus,
        )
    }

    /// Counts in a worker of these amounts (as [`Least::parts`] gives them).
    pub(super) fn add_parts(&mut self, cpus: f64, mem: f64, gpus: Gpus) {
        self.cpus = self.cpus.min(cpus);
        self.mem = self.mem.min(mem);
        self.gpus = self.gpus.min(gpus);
    }

    /// Whether some view has at least this much of each (a necessary condition for any
    /// eligible job's worker to fit there).
    pub(super) fn fits_some(&self, views: &[AgentView]) -> bool {
        self.amounts()
            .is_some_and(|least| views.iter().any(|v| v.resources.contains(&least)))
    }

    /// As [`Least::fits_some`], with `parts` (a reservation's) taken off the views first.
    pub(super) fn fits_some_outside(&self, views: &[AgentView], parts: &Parts) -> bool {
        let Some(least) = self.amounts() else {
            return false;
        };
        views.iter().any(|v| {
            let mut left = None;
            for (_, res, _) in parts.iter().filter(|p| p.0 == v.agent_id) {
                let r: &Resources = left.as_ref().unwrap_or(&v.resources);
                left = Some(r.saturating_sub(res));
            }
            left.as_ref().unwrap_or(&v.resources).contains(&least)
        })
    }

    /// The amounts as resources (converted once: the milli-unit conversion keeps the order
    /// of amounts); `None` for [`Least::NONE`].
    fn amounts(&self) -> Option<Resources> {
        if self.gpus == Least::NONE.gpus {
            return None;
        }
        Some(
            Resources::new()
                .with("cpus", self.cpus)
                .with("mem", self.mem)
                .with("gpus", self.gpus.as_f64()),
        )
    }
}
