//! Retries after failures (with backoff; lost and preempted workers do not count) and time
//! limits.

use std::time::{Duration, Instant};

use gantry_sdk::protocol::*;

use super::tests::{launched, spec, update, Cluster};
use super::{Action, Core, CoreConfig};
use crate::model::{JobState, Priority};

fn failed(task: &TaskInfo, code: i32) -> StatusUpdate {
    StatusUpdate {
        message: format!("exited with code {code}"),
        ..update(task, TaskState::Failed, vec![])
    }
}

#[test]
fn a_failed_worker_is_retried_after_a_doubling_backoff_until_retries_run_out() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig {
        retry_backoff: Duration::from_secs(10),
        ..Default::default()
    });
    let t0 = Instant::now();
    let mut s = spec("flaky", "nlp", Priority::Normal, 2, 2);
    s.max_retries = 2;
    q.submit(s, t0);
    let tasks = launched(&q.offers(c.offers(&[8]), t0));
    assert_eq!(tasks.len(), 2);
    for t in &tasks {
        q.update(&update(t, TaskState::Running, vec![]), t0);
    }
    // Worker 0 fails: the other is killed, and the job waits out the backoff.
    let a = q.update(&failed(&tasks[0], 3), t0);
    assert!(a.contains(&Action::Kill(tasks[1].task_id)), "{a:?}");
    q.update(&update(&tasks[1], TaskState::Killed, vec![]), t0);
    let v = q.view(1, t0).unwrap();
    assert_eq!(
        (v.state, v.retries, v.preemptions),
        (JobState::Pending, 1, 0)
    );
    assert_eq!(
        v.pending_reason.as_deref(),
        Some("retry 1 of 2 after a failure, in 10 s")
    );
    assert!(v.message.contains("exited with code 3"), "{}", v.message);
    assert!(launched(&q.offers(c.offers(&[8]), t0 + Duration::from_secs(9))).is_empty());
    let t1 = t0 + Duration::from_secs(10);
    let tasks = launched(&q.offers(c.offers(&[8]), t1));
    assert_eq!(tasks.len(), 2, "relaunched once the backoff is over");
    assert_eq!(q.view(1, t1).unwrap().attempts, 2);
    // A lost worker is requeued at once and does not count.
    q.update(&update(&tasks[0], TaskState::Lost, vec![]), t1);
    q.update(&update(&tasks[1], TaskState::Killed, vec![]), t1);
    let v = q.view(1, t1).unwrap();
    assert_eq!((v.state, v.retries), (JobState::Pending, 1));
    let tasks = launched(&q.offers(c.offers(&[8]), t1));
    assert_eq!(tasks.len(), 2);
    // The second failure waits twice as long.
    q.update(&failed(&tasks[1], 1), t1);
    q.update(&update(&tasks[0], TaskState::Killed, vec![]), t1);
    assert!(launched(&q.offers(c.offers(&[8]), t1 + Duration::from_secs(19))).is_empty());
    let t2 = t1 + Duration::from_secs(20);
    let tasks = launched(&q.offers(c.offers(&[8]), t2));
    assert_eq!(tasks.len(), 2);
    // No retry left: the job fails with the worker's real status.
    q.update(&failed(&tasks[0], 7), t2);
    let v = q.view(1, t2).unwrap();
    assert_eq!(v.state, JobState::Failed);
    assert_eq!(
        v.message,
        "worker 0 FAILED: exited with code 7 (after 2 retries)"
    );
}

#[test]
fn an_attempt_past_its_time_limit_is_killed_and_the_job_fails_with_the_reason() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    let mut s = spec("slow", "nlp", Priority::Normal, 1, 1);
    s.time_limit_secs = Some(60);
    s.max_retries = 3;
    q.submit(s, t0);
    let tasks = launched(&q.offers(c.offers(&[8]), t0));
    q.update(&update(&tasks[0], TaskState::Running, vec![]), t0);
    assert!(!q
        .tick(t0 + Duration::from_secs(59))
        .contains(&Action::KillFor(tasks[0].task_id, TaskReason::TimeLimit)));
    let a = q.tick(t0 + Duration::from_secs(60));
    // Killed with its reason: operators read `time-limit`, not `killed-by-request`.
    assert!(
        a.contains(&Action::KillFor(tasks[0].task_id, TaskReason::TimeLimit)),
        "{a:?}"
    );
    let t1 = t0 + Duration::from_secs(61);
    // Its end (killed) changes nothing: time-limit is not retried.
    q.update(&update(&tasks[0], TaskState::Killed, vec![]), t1);
    let v = q.view(1, t1).unwrap();
    assert_eq!(v.state, JobState::Failed);
    assert_eq!(v.retries, 0);
    assert_eq!(v.message, "time-limit: killed after its time limit of 60 s");
}

#[test]
fn kills_count_by_the_sdks_rules_preempted_elsewhere_requeues_an_unexplained_kill_fails() {
    let c = Cluster::new(1);
    let mut q = Core::new(CoreConfig {
        retry_backoff: Duration::from_secs(10),
        ..Default::default()
    });
    let t0 = Instant::now();
    let mut s = spec("one", "nlp", Priority::Normal, 1, 1);
    s.max_retries = 1;
    q.submit(s, t0);
    let killed = |t: &TaskInfo, reason: Option<TaskReason>| StatusUpdate {
        reason,
        ..update(t, TaskState::Killed, vec![])
    };
    // Killed by someone else to make room, or on a kill the queue asked for before a restart:
    // requeued at once, not counted (`gantry_sdk::attempts::ending`).
    for reason in [TaskReason::Preempted, TaskReason::KilledByRequest] {
        let tasks = launched(&q.offers(c.offers(&[8]), t0));
        assert_eq!(tasks.len(), 1, "{reason:?}");
        q.update(&killed(&tasks[0], Some(reason)), t0);
        let v = q.view(1, t0).unwrap();
        assert_eq!((v.state, v.retries), (JobState::Pending, 0), "{reason:?}");
    }
    // Killed with no reason that is not its own (an OOM-style kill by the agent): it counts.
    let tasks = launched(&q.offers(c.offers(&[8]), t0));
    q.update(&killed(&tasks[0], None), t0);
    let v = q.view(1, t0).unwrap();
    assert_eq!(
        (v.state, v.retries),
        (JobState::Pending, 1),
        "{}",
        v.message
    );
    let t1 = t0 + Duration::from_secs(10);
    let tasks = launched(&q.offers(c.offers(&[8]), t1));
    assert_eq!(tasks.len(), 1, "retried after the backoff");
    q.update(&killed(&tasks[0], None), t1);
    assert_eq!(q.view(1, t1).unwrap().state, JobState::Failed);
}
