//! The runtime's blocking helpers (run on blocking threads, off the loop): settling a task's
//! cgroup (its OOM flag and final usage recorded; destroyed before the task's terminal update
//! when processes are left in it, after it — or returned to the pool — when it is already
//! empty), making pool cgroups, one usage sample, and one pass measuring sandboxes.

use std::collections::HashMap;
use std::path::Path;

use gantry_proto::*;

use super::PoolGate;
use crate::core::CgroupOutcome;
use crate::discovery::NvmlGpus;
use crate::executor;
use crate::gpu;
use crate::isolation::{Baseline, Isolator, TaskCgroup};

/// Reads a task cgroup's OOM flag and usage and records them in the task's meta directory
/// (blocking). A cgroup with processes left in it is destroyed here, so that the task's
/// terminal update (which frees its resources) follows their end; an empty one is left for
/// [`destroy_cgroup`] after the update is on its way (off the task's path; a restarted agent
/// removes the cgroups of ended tasks). Without a cgroup (gone already), the recorded outcome
/// is returned. `fresh`: this run's launch made the handle, so nothing was recorded before
/// (neither an outcome nor a baseline: the handle has its own) and no file is read.
pub(super) fn settle_cgroup(cg: Option<&TaskCgroup>, meta: &Path, fresh: bool) -> CgroupOutcome {
    // The launch record, read once: the final OOM flag and usage, recorded there before the
    // cgroup was destroyed (so a restarted agent still reports the real outcome), and the
    // reused cgroup's counters at the task's start, recorded with the supervisor's claim.
    let record = if fresh {
        None
    } else {
        executor::record::read(meta)
    };
    let recorded: Option<CgroupOutcome> = record
        .as_ref()
        .and_then(|r| r.cgroup.as_deref())
        .and_then(|j| serde_json::from_str(j).ok());
    let Some(cg) = cg.filter(|c| c.is_isolated()) else {
        return recorded.unwrap_or_default();
    };
    // The baseline is needed when this handle was reopened by a restarted agent.
    let mut reopened;
    let cg = if !fresh && cg.baseline() == Baseline::default() {
        match record
            .as_ref()
            .and_then(|r| r.base.as_deref())
            .and_then(|j| serde_json::from_str::<Baseline>(j).ok())
        {
            Some(base) => {
                reopened = cg.clone();
                reopened.set_baseline(base);
                &reopened
            }
            None => cg,
        }
    } else {
        cg
    };
    // Recorded by an earlier incarnation that died while destroying the cgroup: that reading
    // was taken from the whole cgroup and stays authoritative.
    if let Some(outcome) = recorded {
        destroy_cgroup(cg);
        return outcome;
    }
    let outcome = read_outcome(cg);
    record_outcome(meta, cg, &outcome);
    if cg.pids().map_or(true, |p| !p.is_empty()) {
        destroy_cgroup(cg);
    }
    outcome
}

/// The OOM flag and final usage of the cgroup of a task this run launched, read where its
/// exit is learned ([`crate::core::Input::Exited`], blocking). An empty cgroup is left as it
/// is and nothing is written: it is released only after the task's terminal record is synced
/// ([`crate::core::Effect::ReleaseCgroup`]), so until then a restarted agent reads the same
/// counters from the cgroup itself. One with processes left in it is destroyed here (the
/// terminal update, which frees the task's resources, follows their end), its outcome
/// recorded first in the launch record, the only place a restarted agent could find it then.
pub(super) fn exit_outcome(cg: &TaskCgroup, meta: &Path) -> CgroupOutcome {
    let outcome = read_outcome(cg);
    if cg.pids().map_or(true, |p| !p.is_empty()) {
        record_outcome(meta, cg, &outcome);
        destroy_cgroup(cg);
    }
    outcome
}

fn read_outcome(cg: &TaskCgroup) -> CgroupOutcome {
    CgroupOutcome {
        oom_killed: cg.oom_killed().unwrap_or_else(|e| {
            tracing::warn!(task = cg.task_id(), "reading the OOM flag: {e}");
            false
        }),
        usage: cg.usage().ok(),
    }
}

/// Appends a cgroup's outcome to the task's launch record (before the cgroup is destroyed).
fn record_outcome(meta: &Path, cg: &TaskCgroup, outcome: &CgroupOutcome) {
    if let Ok(json) = serde_json::to_string(outcome) {
        if let Err(e) = executor::record::append(meta, "cgroup", &json, true) {
            tracing::warn!(task = cg.task_id(), "cannot record the cgroup outcome: {e}");
        }
    }
}

/// Destroys a task cgroup, retrying; a cgroup that cannot be removed is logged (the next
/// agent start removes it). Cheap when it is gone already.
pub(super) fn destroy_cgroup(cg: &TaskCgroup) {
    for attempt in 1..=3 {
        match cg.destroy() {
            Ok(()) => return,
            Err(e) => {
                tracing::error!(
                    task = cg.task_id(),
                    attempt,
                    "destroying the task cgroup: {e}"
                )
            }
        }
    }
}

/// Makes pool cgroups (blocking); returns the names made. Stops when the gate closes.
pub(super) fn prepare_cgroups(iso: &Isolator, names: Vec<String>, gate: &PoolGate) -> Vec<String> {
    let mut ready = Vec::with_capacity(names.len());
    for name in names {
        let made = gate.while_open(|| iso.create_slot(&name));
        match made {
            None => break,
            Some(Ok(())) => ready.push(name),
            Some(Err(e)) => {
                tracing::warn!(cgroup = %name, "making a pool cgroup: {e}");
                break;
            }
        }
    }
    ready
}

/// Readies an ended task's empty cgroup for the pool (blocking); its name when it may go back,
/// `None` when it must be removed instead (not empty, not made by this run, gate closed).
pub(super) fn recycle_cgroup(cg: &TaskCgroup, gate: &PoolGate) -> Option<String> {
    let r = gate.while_open(|| cg.recycle())?;
    match r {
        Ok(()) => Some(cg.task_id().to_string()),
        Err(e) => {
            tracing::debug!(cgroup = cg.task_id(), "not pooled again: {e}");
            None
        }
    }
}

/// Releases a settled task's cgroup (blocking), after its terminal update is on its way: an
/// empty one goes back to the pool when `recycle` and the pool takes it, or is removed (one
/// with processes left was removed before); the pool hears which (`CgroupRecycled`).
pub(super) fn release_cgroup(
    cg: Option<TaskCgroup>,
    recycle: bool,
    gate: &PoolGate,
    tx: &super::Senders,
) {
    let cg = cg.filter(TaskCgroup::is_isolated);
    let back = match &cg {
        Some(cg) if recycle => recycle_cgroup(cg, gate),
        _ => None,
    };
    if back.is_none() {
        if let Some(cg) = &cg {
            destroy_cgroup(cg);
        }
    }
    if recycle {
        tx.input(crate::core::Input::CgroupRecycled(back));
    }
}

/// One usage sample (blocking): GPU samples and processes from NVML, cpu/memory from each
/// task's cgroup, GPU figures attributed to tasks through the pids of their cgroups (or process
/// groups without isolation).
pub(super) fn sample(
    gpus: Option<&NvmlGpus>,
    tasks: &[(TaskId, Option<TaskCgroup>, i32, Vec<String>)],
) -> (Vec<(TaskId, TaskUsage)>, Vec<GpuSample>) {
    let (samples, procs) = match gpus {
        Some(g) => (g.sample(), g.processes()),
        None => (Vec::new(), Vec::new()),
    };
    let mut pid_task = HashMap::new();
    let mut assigned = HashMap::new();
    let mut out = Vec::with_capacity(tasks.len());
    for (id, cg, pgid, uuids) in tasks {
        let cg = cg.as_ref().filter(|c| c.is_isolated());
        let usage = match cg.map(TaskCgroup::usage) {
            None => TaskUsage::default(),
            Some(Ok(u)) => u,
            // Gone meanwhile (the task is ending): its final usage is sent when it settles.
            Some(Err(_)) => continue,
        };
        if !procs.is_empty() {
            let pids = match cg {
                Some(c) => c.pids().unwrap_or_default(),
                None => executor::group_pids(*pgid),
            };
            for p in pids {
                pid_task.insert(p, *id);
            }
        }
        for u in uuids {
            assigned.insert(u.clone(), *id);
        }
        out.push((*id, usage));
    }
    let attributed = gpu::attribute(&samples, &procs, &pid_task, &assigned);
    for (id, u) in &mut out {
        if let Some(g) = attributed.get(id) {
            u.gpu_mem_bytes = g.mem_bytes;
            u.gpu_util_percent = g.util_percent;
        }
    }
    (out, samples)
}

/// What a pass over sandboxes yields: its readings, and the walks it left unfinished.
type DiskPass = (
    Vec<(TaskId, crate::disk::DiskReading)>,
    Vec<(TaskId, crate::disk::DuWalk)>,
);

/// One pass measuring sandboxes (disk limits, [`crate::disk`]): each task's walk, the one an
/// earlier pass left unfinished or a new one, goes on for its share of the pass's budget. A
/// sandbox that cannot be opened (not made yet, removed) has no reading this pass.
pub(super) fn measure_disk(
    tasks: Vec<(TaskId, std::path::PathBuf, Option<crate::disk::DuWalk>)>,
) -> DiskPass {
    let budget = crate::disk::task_budget(tasks.len());
    let mut readings = Vec::with_capacity(tasks.len());
    let mut unfinished = Vec::new();
    for (id, sandbox, walk) in tasks {
        let mut walk = match walk.map_or_else(|| crate::disk::DuWalk::start(&sandbox), Ok) {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!(task = %id, "disk usage not measured: {e}");
                continue;
            }
        };
        let reading = walk.step(budget);
        tracing::debug!(task = %id, bytes = reading.bytes, complete = reading.complete, skipped = walk.skipped(), "sandbox measured");
        readings.push((id, reading));
        if !reading.complete {
            unfinished.push((id, walk));
        }
    }
    (readings, unfinished)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolation::{IsolationMode, Isolator, Limits};

    #[test]
    fn settled_outcome_survives_a_missing_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        // Nothing recorded, no cgroup: no OOM, no usage.
        let o = settle_cgroup(None, dir.path(), false);
        assert!(!o.oom_killed && o.usage.is_none());
        // A recorded outcome (written before the cgroup was destroyed) is read back.
        let recorded = CgroupOutcome {
            oom_killed: true,
            usage: Some(TaskUsage {
                mem_peak_bytes: 64 << 20,
                ..TaskUsage::default()
            }),
        };
        executor::record::append(
            dir.path(),
            "cgroup",
            &serde_json::to_string(&recorded).unwrap(),
            true,
        )
        .unwrap();
        let o = settle_cgroup(None, dir.path(), false);
        assert!(o.oom_killed);
        assert_eq!(o.usage.unwrap().mem_peak_bytes, 64 << 20);
        // Without isolation the task "cgroup" is not one: the record is used as well.
        let iso = Isolator::new(IsolationMode::None, None).unwrap();
        let limits = Limits {
            cpus: 1.0,
            mem_mib: None,
            pids_max: None,
            cpu_hard_limit: false,
            devices: None,
        };
        let cg = iso.create("t", &limits).unwrap();
        assert!(settle_cgroup(Some(&cg), dir.path(), false).oom_killed);
        // A handle this run's launch made has no earlier record to read.
        assert!(!settle_cgroup(Some(&cg), dir.path(), true).oom_killed);
    }

    #[test]
    fn sampling_without_gpus_or_cgroups() {
        let iso = Isolator::new(IsolationMode::None, None).unwrap();
        let limits = Limits {
            cpus: 1.0,
            mem_mib: None,
            pids_max: None,
            cpu_hard_limit: false,
            devices: None,
        };
        let cg = iso.create("t", &limits).unwrap();
        let id = TaskId::random();
        // SAFETY: getpgrp has no preconditions.
        let pgid = unsafe { libc::getpgrp() };
        let (tasks, gpus) = sample(None, &[(id, Some(cg), pgid, Vec::new())]);
        assert!(gpus.is_empty());
        assert_eq!(tasks, vec![(id, TaskUsage::default())]);
    }
}
