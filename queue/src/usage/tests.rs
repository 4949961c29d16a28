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
        // 16 an hour: 2 per GPU for GPU-dominant workers.
        attributes: Arc::new(
            [("price_per_hour".to_string(), "16".to_string())]
                .into_iter()
                .collect(),
        ),
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

/// Workers run known times through the core on a priced agent; the store's history gives
/// those GPU-hours and their cost (price × dominant share × time).
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
    // Cost at 16 an hour for 8 GPUs (64 CPUs): vision half the agent for 1.5 h = 12; nlp two
    // quarters for 0.5 h = 4.
    let cost = |rows: &[UsageRow], i: usize| rows[i].cost.unwrap();
    assert!((cost(&rows, 0) - 12.0).abs() < 1e-6, "{rows:?}");
    assert!((cost(&rows, 1) - 4.0).abs() < 1e-6, "{rows:?}");
    let rows = summarize(&history, wall0, end, By::User);
    assert_eq!(rows[1].user.as_deref(), Some("alice"));
    // The last hour only: vision ran 1 h of it (4 GPU-hours), nlp had ended.
    let rows = summarize(&history, end - 3_600_000, end, By::Team);
    assert_eq!(rows.len(), 1);
    assert!((rows[0].gpu_hours - 4.0).abs() < 1e-9, "{rows:?}");
    // ... and paid for that hour of its run: 8.
    assert!((rows[0].cost.unwrap() - 8.0).abs() < 1e-6, "{rows:?}");
    assert!(csv(&rows).starts_with("team,user,gpu_hours,cost,jobs,workers\nvision,,4,8"));
    assert!(table(&rows).contains("vision"));
}

/// A team's budget counts its running workers' cost so far and its ended workers' cost, and
/// the spending survives a restart through the store's history.
#[test]
fn budgets_count_running_and_ended_workers_and_survive_a_restart() {
    use crate::budget::{BudgetConfig, BudgetState};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("q.redb")).unwrap();
    let mut budgets = BudgetConfig::default();
    budgets.add("vision=10").unwrap();
    let config = CoreConfig {
        budgets,
        ..CoreConfig::default()
    };
    let mut q = Core::new(config.clone());
    let t0 = Instant::now();
    let wall0: u64 = 1_900_000_000_000;
    q.set_wall_clock(t0, wall0);
    let wall = |t: Instant| wall0 + t.duration_since(t0).as_millis() as u64;
    assert_eq!(q.budget("vision", t0).unwrap().state, BudgetState::Ok);
    assert_eq!(q.budget("nlp", t0), None, "no budget, no limit");
    // 4 GPUs of a 16-an-hour 8-GPU agent: 8 an hour.
    q.submit_as(spec("b", "vision", 4, 1), "bob".into(), t0);
    let tasks = launched(&q.offers(vec![offer(AgentId::random())], t0));
    q.update(&report(&tasks[0], TaskState::Running, 4), t0);
    let at = |mins: u64| t0 + Duration::from_secs(60 * mins);
    // After 30 minutes: 4 spent, fine; after 66: 8.8, past 80%; after 75: 10, over.
    let spent = |q: &Core, t| q.budget("vision", t).unwrap();
    assert_eq!(spent(&q, at(30)).state, BudgetState::Ok);
    assert!((spent(&q, at(30)).spent - 4.0).abs() < 1e-6);
    assert_eq!(spent(&q, at(66)).state, BudgetState::Warn);
    assert_eq!(spent(&q, at(75)).state, BudgetState::Over);
    // It ends at 60 minutes: 8 spent, recorded in the history at the commit.
    q.update(&report(&tasks[0], TaskState::Finished, 4), at(60));
    store.commit(&q.take_changes(at(60), wall(at(60)))).unwrap();
    let v = spent(&q, at(90));
    assert!(
        (v.spent - 8.0).abs() < 1e-6 && v.state == BudgetState::Warn,
        "{v:?}"
    );
    assert_eq!(q.budgets(at(90)).len(), 1);
    // A new queue from the store knows the 8.
    let mut q2 = Core::new(config);
    q2.set_wall_clock(at(90), wall(at(90)));
    q2.count_spending(&store.usage().unwrap(), wall(at(90)));
    let v = q2.budget("vision", at(90)).unwrap();
    assert!(
        (v.spent - 8.0).abs() < 1e-6 && v.state == BudgetState::Warn,
        "{v:?}"
    );
}

/// Records written before workers were priced read back without a cost.
#[test]
fn usage_records_without_a_cost_still_read() {
    let r: crate::model::UsageRecord = serde_json::from_value(serde_json::json!({
        "job": 1, "team": "nlp", "user": "a", "attempt": 1,
        "task_id": TaskId::random(), "gpus": 1, "secs": 2.0, "ended_unix_ms": 5000
    }))
    .unwrap();
    assert_eq!(r.cost, None);
    let rows = summarize(&[r], 0, 10_000, By::Team);
    assert_eq!(rows[0].cost, None);
    assert!(table(&rows).contains(" - "), "{}", table(&rows));
}

/// A gang of two half-GPU workers that ran an hour used one GPU-hour and paid for half a GPU
/// each (a fraction's share of the agent is its fraction of one GPU over the agent's GPUs).
#[test]
fn fractions_count_their_share_in_gpu_hours_and_cost() {
    let mut q = Core::new(CoreConfig::default());
    let t0 = Instant::now();
    let wall0: u64 = 1_900_000_000_000;
    let mut s = spec("h", "nlp", 0, 2);
    s.gpus = crate::model::Gpus::from_milli(500);
    q.submit_as(s, "alice".into(), t0);
    let tasks = launched(&q.offers(vec![offer(AgentId::random())], t0));
    assert_eq!(tasks.len(), 2);
    for t in &tasks {
        q.update(&report(t, TaskState::Running, 1), t0);
    }
    let at = t0 + Duration::from_secs(3600);
    for t in &tasks {
        q.update(&report(t, TaskState::Finished, 1), at);
    }
    let history = q.take_changes(at, wall0 + 3_600_000).usage;
    assert_eq!(history.len(), 2);
    let rows = summarize(&history, wall0, wall0 + 3_600_000, By::Team);
    assert!((rows[0].gpu_hours - 1.0).abs() < 1e-9, "{rows:?}");
    // 16 an hour for 8 GPUs: half a GPU is 1 an hour, two of them 2.
    assert!((rows[0].cost.unwrap() - 2.0).abs() < 1e-6, "{rows:?}");
}
