//! The core's records and a core rebuilt from them.

use std::time::{Duration, Instant};

use gantry_sdk::protocol::*;

use super::super::tests::{launched, spec, update, Cluster};
use super::super::{Action, Core, CoreConfig};
use crate::model::{JobState, Priority};

const WALL: u64 = 1_800_000_000_000;

#[test]
fn a_core_rebuilt_from_its_records_goes_on_where_it_stopped() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    q.submit_as(spec("a", "nlp", Priority::Normal, 4, 1), "alice".into(), t0);
    q.submit_as(spec("b", "nlp", Priority::Normal, 4, 1), "bob".into(), t0);
    q.submit_as(spec("c", "cv", Priority::Normal, 8, 1), "carol".into(), t0);
    let first = q.take_changes(t0, WALL);
    assert_eq!(first.jobs.len(), 3);
    assert_eq!(first.next_id, 4);
    // Nothing changed: nothing to write.
    assert!(q.take_changes(t0, WALL).is_empty());
    let t1 = t0 + Duration::from_secs(2);
    let tasks = launched(&q.offers(c.offers(&[8]), t1));
    assert_eq!(tasks.len(), 2);
    q.update(&update(&tasks[0], TaskState::Running, vec![]), t1);
    q.update(&update(&tasks[1], TaskState::Running, vec![]), t1);
    let t2 = t1 + Duration::from_secs(3);
    // One ends: its usage (4 GPUs as planned, 3 s) goes with the change.
    q.update(&update(&tasks[0], TaskState::Finished, vec![]), t2);
    let changes = q.take_changes(t2, WALL + 5_000);
    assert_eq!(changes.usage.len(), 1);
    assert_eq!(changes.usage[0].gpus, crate::model::Gpus::whole(4));
    assert_eq!(changes.usage[0].user, "alice");
    assert!((changes.usage[0].secs - 3.0).abs() < 1e-9);
    let mut records = first.jobs.clone();
    for r in changes.jobs {
        let i = records.iter().position(|x| x.id == r.id).unwrap();
        records[i] = r;
    }
    assert_eq!(records[0].state, JobState::Finished);
    assert_eq!(records[0].attempts, 1);
    assert_eq!(records[1].state, JobState::Running);
    assert_eq!(records[1].members.len(), 1);
    assert_eq!(records[2].state, JobState::Pending);

    // A new process, 10 s of wall time later.
    let later = Instant::now() + Duration::from_secs(30);
    let mut r = Core::new(CoreConfig::default());
    let gpu_secs = [("nlp".to_string(), 12.0)].into();
    let owed = r.restore(records, gpu_secs, changes.next_id, later, WALL + 15_000);
    assert!(owed.is_empty(), "{owed:?}");
    // Rebuilt as it was: nothing to write.
    assert!(r.take_changes(later, WALL + 15_000).is_empty());
    let views = r.views(later);
    assert_eq!(
        views
            .iter()
            .map(|v| (v.id, v.state, v.user.as_str()))
            .collect::<Vec<_>>(),
        [
            (1, JobState::Finished, "alice"),
            (2, JobState::Running, "bob"),
            (3, JobState::Pending, "carol"),
        ]
    );
    // Ages carried across by the wall clock: c was submitted 15 s before.
    assert!(
        (views[2].age_secs - 15.0).abs() < 0.01,
        "{}",
        views[2].age_secs
    );
    assert_eq!(r.task_ids(), vec![tasks[1].task_id]);
    // The running worker's end, as the master reconciles it, settles its job and c runs.
    let a = r.update(&update(&tasks[1], TaskState::Finished, vec![]), later);
    assert!(a.is_empty() || launched(&a).is_empty());
    assert_eq!(r.view(2, later).unwrap().state, JobState::Finished);
    let a = r.offers(c.offers(&[8]), later);
    assert_eq!(launched(&a).len(), 1);
    // Ids go on from the store's.
    let (id, _) = r.submit(spec("d", "nlp", Priority::Normal, 1, 1), later);
    assert_eq!(id, 4);
}

#[test]
fn kills_under_way_are_owed_again_after_a_restart() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    q.submit(spec("a", "nlp", Priority::Normal, 4, 1), t0);
    let tasks = launched(&q.offers(c.offers(&[8]), t0));
    q.update(&update(&tasks[0], TaskState::Running, vec![]), t0);
    let kill = q.cancel(1, t0).unwrap();
    assert!(kill.contains(&Action::Kill(tasks[0].task_id)));
    let records = q.take_changes(t0, WALL).jobs;
    assert_eq!(records[0].state, JobState::Cancelled);
    assert!(records[0].members[0].killing);
    let mut r = Core::new(CoreConfig::default());
    let owed = r.restore(records, Default::default(), 2, t0, WALL);
    assert_eq!(owed, vec![Action::Kill(tasks[0].task_id)]);
    // Its end arrives: the job stays cancelled and the worker is gone.
    r.update(&update(&tasks[0], TaskState::Killed, vec![]), t0);
    let v = r.view(1, t0).unwrap();
    assert_eq!(v.state, JobState::Cancelled);
    assert!(v.members.is_empty());
}

#[test]
fn a_worker_the_master_never_heard_of_is_relaunched_not_counted_as_a_preemption() {
    // The queue committed a launch and died before sending it: the master answers the
    // reconciliation with LOST ("unknown task"), and the job is requeued and relaunched.
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    q.submit(spec("a", "nlp", Priority::Normal, 4, 1), t0);
    let tasks = launched(&q.offers(c.offers(&[8]), t0));
    let records = q.take_changes(t0, WALL).jobs;
    let mut r = Core::new(CoreConfig::default());
    r.restore(records, Default::default(), 2, t0, WALL);
    let lost = StatusUpdate {
        message: "unknown task".into(),
        ..update(&tasks[0], TaskState::Lost, vec![])
    };
    r.update(&lost, t0);
    let v = r.view(1, t0).unwrap();
    assert_eq!(v.state, JobState::Pending);
    assert_eq!(v.preemptions, 0);
    let again = launched(&r.offers(c.offers(&[8]), t0));
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].task_id, tasks[0].task_id);
    assert_eq!(r.view(1, t0).unwrap().attempts, 2);
}

#[test]
fn shutdown_cancels_jobs_with_workers_and_keeps_pending_ones() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    q.submit(spec("a", "nlp", Priority::Normal, 8, 1), t0);
    q.submit(spec("b", "nlp", Priority::Normal, 8, 1), t0);
    launched(&q.offers(c.offers(&[8]), t0));
    q.shutdown();
    assert_eq!(q.view(1, t0).unwrap().state, JobState::Cancelled);
    assert_eq!(q.view(2, t0).unwrap().state, JobState::Pending);
    assert!(q.task_ids().is_empty());
}

#[test]
fn a_retry_waiting_out_its_backoff_still_waits_after_a_restart() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig {
        retry_backoff: Duration::from_secs(10),
        ..Default::default()
    });
    let t0 = Instant::now();
    let mut s = spec("flaky", "nlp", Priority::Normal, 1, 1);
    s.max_retries = 1;
    q.submit(s, t0);
    let tasks = launched(&q.offers(c.offers(&[8]), t0));
    let failed = StatusUpdate {
        message: "exited with code 3".into(),
        ..update(&tasks[0], TaskState::Failed, vec![])
    };
    q.update(&failed, t0);
    let records = q.take_changes(t0, WALL).jobs;
    assert_eq!(records[0].not_before_unix_ms, Some(WALL + 10_000));
    // Restarted 4 s later: 6 s of backoff left.
    let t1 = t0 + Duration::from_secs(4);
    let mut r = Core::new(CoreConfig::default());
    r.restore(records, Default::default(), 2, t1, WALL + 4_000);
    let v = r.view(1, t1).unwrap();
    assert_eq!(
        v.pending_reason.as_deref(),
        Some("retry 1 of 1 after a failure, in 6 s")
    );
    assert!(launched(&r.offers(c.offers(&[8]), t1)).is_empty());
    let t2 = t0 + Duration::from_secs(10);
    assert_eq!(launched(&r.offers(c.offers(&[8]), t2)).len(), 1);
}
