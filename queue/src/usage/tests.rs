//! Usage figures against the members' run times: through the core and a real store file, and
//! the window's clipping.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gantry_sdk::protocol::*;

use super::*;
use crate::core::{Action, Core, CoreConfig};
use crate::model::JobSpec;
use crate::store::Store;

fn offer(agent: AgentId) -> Offer {
    let gpus: Vec<GpuInfo> = (0..8)
        .map(|i| GpuInfo {
            uuid: format!("GPU-u-{i}"),
            name: "NVIDIA H100".into(),
            memory_mib: 81920,
            compute_capability: (9, 0),
            minor: i,
            pci_bus_id: format!("0000:{i:02x}:00.0"),
            numa_node: Some(0),
            pci_root: None,
            healthy: true,
            mig_profile: None,
            parent_uuid: None,
        })
        .collect();
    Offer {
        id: OfferId::random(),
        framework_id: FrameworkId::random(),
        agent_id: agent,
        hostname: "h0".into(),
        role: "default".into(),
        resources: Resources::new()
            .with("cpus", 64.0)
            .with("mem", 65536.0)
            .with("gpus", 8.0),
        reserved: Default::default(),
        attributes: Default::default(),
        gpus: Arc::from(gpus),
        gpu_free: Vec::new(),
        agent_name: "h0".into(),
    }
}

fn spec(name: &str, team: &str, gpus: u32, workers: u32) -> JobSpec {
    serde_json::from_value(serde_json::json!({
        "name": name, "team": team, "command": ["true"], "gpus": gpus,
        "min_workers": workers, "max_workers": workers,
    }))
    .unwrap()
}

fn launched(actions: &[Action]) -> Vec<TaskInfo> {
    actions
        .iter()
        .flat_map(|a| match a {
            Action::Launch { tasks, .. } => tasks.clone(),
            _ => Vec::new(),
        })
        .collect()
}

fn report(task: &TaskInfo, state: TaskState, gpus: u32) -> StatusUpdate {
    StatusUpdate {
        gpus: (0..gpus)
            .map(|i| format!("GPU-{}-{i}", task.name))
            .collect(),
        ..StatusUpdate::new(task.task_id, FrameworkId::random(), state)
    }
}

/// Workers run known times through the core; the store's history gives those GPU-hours.
#[test]
fn usage_from_the_store_matches_the_members_run_times() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("q.redb")).unwrap();
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    let wall0: u64 = 1_900_000_000_000;
    let wall = |t: Instant| wall0 + t.duration_since(t0).as_millis() as u64;
    // nlp/alice: a 2-worker gang of 2 GPUs for 30 minutes; vision/bob: 4 GPUs for 90 minutes.
    q.submit_as(spec("a", "nlp", 2, 2), "alice".into(), t0);
    q.submit_as(spec("b", "vision", 4, 1), "bob".into(), t0);
    let tasks = launched(&q.offers(vec![offer(AgentId::random())], t0));
    assert_eq!(tasks.len(), 3, "both jobs launch on the 8 GPUs");
    for t in &tasks {
        let g = t.resources.get("gpus") as u32;
        q.update(&report(t, TaskState::Running, g), t0);
    }
    for t in &tasks {
        let g = t.resources.get("gpus") as u32;
        let mins = if t.name.starts_with("a/") { 30 } else { 90 };
        let at = t0 + Duration::from_secs(60 * mins);
        q.update(&report(t, TaskState::Finished, g), at);
        store.commit(&q.take_changes(at, wall(at))).unwrap();
    }
    drop(store);
    let store = Store::open(&dir.path().join("q.redb")).unwrap();
    let history = store.usage().unwrap();
    assert_eq!(history.len(), 3);
    let end = wall0 + 90 * 60_000;
    let rows = summarize(&history, wall0, end, By::Team);
    let hours: Vec<(&str, f64, u64, u64)> = rows
        .iter()
        .map(|r| (r.team.as_str(), r.gpu_hours, r.jobs, r.workers))
        .collect();
    // vision: 4 GPUs × 1.5 h = 6; nlp: 2 workers × 2 GPUs × 0.5 h = 2.
    assert_eq!(hours, [("vision", 6.0, 1, 1), ("nlp", 2.0, 1, 2)]);
    let rows = summarize(&history, wall0, end, By::User);
    assert_eq!(rows[1].user.as_deref(), Some("alice"));
    // The last hour only: vision ran 1 h of it (4 GPU-hours), nlp had ended.
    let rows = summarize(&history, end - 3_600_000, end, By::Team);
    assert_eq!(rows.len(), 1);
    assert!((rows[0].gpu_hours - 4.0).abs() < 1e-9, "{rows:?}");
    assert!(csv(&rows).starts_with("team,user,gpu_hours,jobs,workers\nvision,,4,1,1\n"));
    assert!(table(&rows).contains("vision"));
}
