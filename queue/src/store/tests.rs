//! The store on real files: round trips, the schema version check, one process per store.

use super::*;
use crate::model::{JobSpec, JobState, MemberRecord, Priority};
use gantry_sdk::protocol::{AgentId, TaskId, TaskState};

fn spec(name: &str) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": name, "team": "nlp", "command": ["true"], "gpus": 2
    }))
    .unwrap()
}

fn job(id: u64, state: JobState, members: usize) -> JobRecord {
    JobRecord {
        id,
        spec: spec(&format!("j{id}")),
        user: "alice".into(),
        state,
        submitted_unix_ms: 1_000,
        waiting_since_unix_ms: 2_000,
        waited_ms: 3,
        preemptions: 1,
        attempts: 2,
        retries: 0,
        retrying: false,
        not_before_unix_ms: None,
        attempt_started_unix_ms: None,
        preempting: false,
        lost: false,
        finished_members: 0,
        next_index: members as u32,
        message: String::new(),
        on_deps: false,
        members: (0..members)
            .map(|i| MemberRecord {
                index: i as u32,
                task_id: TaskId::random(),
                agent_id: AgentId::random(),
                hostname: "h".into(),
                gpus: vec!["GPU-0".into()],
                state: TaskState::Running,
                killing: false,
                started_unix_ms: 5_000,
            })
            .collect(),
    }
}

#[test]
fn what_is_committed_is_loaded_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.redb");
    let running = job(2, JobState::Running, 2);
    {
        let store = Store::open(&path).unwrap();
        let fw = FrameworkId::random();
        store.set_framework_id(Some(fw)).unwrap();
        let changes = Changes {
            jobs: vec![job(1, JobState::Finished, 0), running.clone()],
            usage: vec![UsageRecord {
                job: 1,
                team: "nlp".into(),
                user: "alice".into(),
                attempt: 1,
                task_id: TaskId::random(),
                gpus: crate::model::Gpus::whole(2),
                secs: 10.0,
                ended_unix_ms: 9_000,
                cost: Some(0.25),
            }],
            next_id: 3,
        };
        store.commit(&changes).unwrap();
        let loaded = store.load(10).unwrap();
        assert_eq!(loaded.framework_id, Some(fw));
    }
    let store = Store::open(&path).unwrap();
    let loaded = store.load(10).unwrap();
    assert_eq!(loaded.jobs.len(), 2);
    assert_eq!(loaded.jobs[1], running);
    assert_eq!(loaded.next_id, 3);
    assert_eq!(loaded.gpu_secs.get("nlp"), Some(&20.0));
    assert!(loaded.framework_id.is_some());
    assert_eq!(store.usage().unwrap().len(), 1);
    assert_eq!(store.job(2).unwrap(), Some(running));
    // A job's newer record replaces the older; forgetting the framework id sticks.
    let mut ended = job(2, JobState::Cancelled, 0);
    ended.spec.priority = Priority::High;
    store
        .commit(&Changes {
            jobs: vec![ended.clone()],
            usage: Vec::new(),
            next_id: 3,
        })
        .unwrap();
    store.set_framework_id(None).unwrap();
    let loaded = store.load(10).unwrap();
    assert_eq!(loaded.jobs[1], ended);
    assert_eq!(loaded.framework_id, None);
}

#[test]
fn only_the_latest_ended_jobs_are_loaded_with_every_active_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("q.redb")).unwrap();
    let mut jobs: Vec<JobRecord> = (1..=5).map(|i| job(i, JobState::Finished, 0)).collect();
    jobs.push(job(6, JobState::Pending, 0));
    // Failed, but a worker is still being killed: not settled, so always loaded.
    jobs.push(job(7, JobState::Failed, 1));
    store
        .commit(&Changes {
            jobs,
            usage: Vec::new(),
            next_id: 8,
        })
        .unwrap();
    let ids: Vec<u64> = store.load(2).unwrap().jobs.iter().map(|j| j.id).collect();
    assert_eq!(ids, [4, 5, 6, 7]);
}

#[test]
fn a_store_from_a_newer_or_unknown_older_schema_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.redb");
    Store::open(&path).unwrap().force_version(99).unwrap();
    let err = Store::open(&path).unwrap_err().to_string();
    assert!(
        err.contains("schema version 99 is newer than this gantry-queue's (2)"),
        "{err}"
    );
    // A version before the first has no migration.
    let store = Database::create(&path).unwrap();
    {
        let tx = store.begin_write().unwrap();
        tx.open_table(META)
            .unwrap()
            .insert("schema_version", 0)
            .unwrap();
        tx.commit().unwrap();
    }
    drop(store);
    let err = Store::open(&path).unwrap_err().to_string();
    assert!(err.contains("schema version 0 is older"), "{err}");
}

#[test]
fn a_store_is_used_by_one_queue_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.redb");
    let _first = Store::open(&path).unwrap();
    let err = Store::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::InUse(_)), "{err}");
    assert!(err.to_string().contains("already open"), "{err}");
}

#[test]
fn a_record_that_does_not_decode_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.redb");
    {
        let db = Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(JOBS)
            .unwrap()
            .insert(4, b"{not json".as_slice())
            .unwrap();
        tx.commit().unwrap();
    }
    let err = Store::open(&path)
        .unwrap()
        .load(10)
        .unwrap_err()
        .to_string();
    assert!(err.contains("job 4 does not decode"), "{err}");
}

/// A version-1 store (whole GPUs as integers) opens unchanged and is stamped version 2; a job
/// of half a GPU is written as `0.5` and read back as such.
#[test]
fn a_version_1_store_opens_and_fractions_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.redb");
    // Version 1 wrote `"gpus": 2`: exactly what a whole-GPU job is written as now.
    let whole = job(1, JobState::Running, 1);
    let text = serde_json::to_string(&whole).unwrap();
    assert!(text.contains(r#""gpus":2,"#), "{text}");
    {
        let store = Store::open(&path).unwrap();
        store
            .commit(&Changes {
                jobs: vec![whole.clone()],
                usage: Vec::new(),
                next_id: 2,
            })
            .unwrap();
        store.force_version(1).unwrap();
    }
    let version = |path: &std::path::Path| {
        let db = Database::create(path).unwrap();
        let tx = db.begin_read().unwrap();
        let v = tx
            .open_table(META)
            .unwrap()
            .get("schema_version")
            .unwrap()
            .map(|v| v.value());
        v
    };
    assert_eq!(version(&path), Some(1));
    let mut half = job(2, JobState::Pending, 0);
    half.spec.gpus = crate::model::Gpus::from_milli(500);
    {
        let store = Store::open(&path).unwrap();
        let loaded = store.load(10).unwrap();
        assert_eq!(loaded.jobs, vec![whole.clone()]);
        assert_eq!(loaded.jobs[0].spec.gpus, crate::model::Gpus::whole(2));
        store
            .commit(&Changes {
                jobs: vec![half.clone()],
                usage: Vec::new(),
                next_id: 3,
            })
            .unwrap();
    }
    assert_eq!(version(&path), Some(2));
    assert!(serde_json::to_string(&half)
        .unwrap()
        .contains(r#""gpus":0.5,"#));
    let store = Store::open(&path).unwrap();
    let loaded = store.load(10).unwrap();
    let got = loaded.jobs.iter().find(|j| j.id == 2).unwrap();
    assert_eq!(got.spec.gpus.milli(), 500);
}
