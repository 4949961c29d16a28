//! The tables against the API's JSON.

use super::*;
use serde_json::json;

#[test]
fn usage_shows_cost_idle_agents_and_held_offers_apart() {
    let v = json!({"by": "role", "since_ms": 0, "until_ms": 3_600_000,
        "history_from_ms": 0,
        "rows": [{"key": "ml", "tasks": 2, "cpu_hours": 1.0, "mem_gib_hours": 2.0,
                  "gpu_hours": 1.5, "cost": 12.25}],
        "total": {"key": "total", "tasks": 2, "cpu_hours": 1.0, "mem_gib_hours": 2.0,
                  "gpu_hours": 1.5, "cost": 12.25},
        "agents": [{"name": "gpu-1", "price_per_hour": 20.0, "hours": 1.0, "cost": 20.0,
                    "attributed": 12.25, "idle_cost": 7.75}],
        "idle_cost": 7.75,
        "held_offers": {"from_ms": 0, "rows": [{"framework": "batch", "role": "ml",
            "cpu_hours": 0.5, "mem_gib_hours": 0.0, "gpu_hours": 0.25}]}});
    let out = usage(&v, true);
    assert!(out.contains("COST") && out.contains("12.25"), "{out}");
    assert!(
        out.contains("idle cost 7.75") && out.contains("gpu-1"),
        "{out}"
    );
    assert!(
        out.contains("held in offers") && out.contains("batch"),
        "{out}"
    );
    let plain = usage(&v, false);
    assert!(
        !plain.contains("COST") && plain.contains("held in offers"),
        "{plain}"
    );
    let csv = usage_csv(&v, true);
    assert!(csv.starts_with("key,tasks,cpu_hours,mem_gib_hours,gpu_hours,cost\n"));
    assert!(csv.contains("\"ml\",2,1,2,1.5,12.25\n"), "{csv}");
    let none = json!({"rows": [], "total": {"key": "total"}});
    assert!(usage(&none, true).contains("no agent carries a price"));
}

#[test]
fn tables_align_columns() {
    let t = table(
        &["A", "LONGER"],
        &[
            vec!["xyz".into(), "1".into()],
            vec!["q".into(), "22".into()],
        ],
    );
    assert_eq!(t, "A    LONGER\nxyz  1\nq    22\n");
}

#[test]
fn agents_show_a_gpu_table() {
    let a = json!([{"name": "n1", "id": "abc", "connected": true, "active": true, "drain": null,
        "total": {"gpus": 1.0}, "used": {},
        "gpus": [{"uuid": "GPU-1", "name": "A100", "memory_mib": 40960, "healthy": false,
                  "sample": {"util_percent": 42, "mem_used_bytes": 2097152},
                  "tasks": [{"name": "train"}]}]}]);
    let out = agents(&a);
    assert!(
        out.contains("GPU-1  A100   40960 MiB  42%   2 MiB     UNHEALTHY  train"),
        "{out}"
    );
}

#[test]
fn tasks_show_their_ports() {
    let v = json!({"total": 1, "offset": 0, "tasks": [{"name": "web", "id": "t1",
        "state": "RUNNING", "reason": null, "framework_id": "f1", "agent_id": "a1",
        "resources": {"cpus": 0.1, "ports": 2.0}, "gpus": [], "ports": [31000, 31001]}]});
    let out = tasks(&v);
    let header = out.lines().next().unwrap();
    assert!(header.ends_with("GPUS  PORTS"), "{out}");
    assert!(out.contains("31000,31001"), "{out}");
}

#[test]
fn events_are_one_line_each_with_names() {
    let mut names = EventNames::default();
    let snap = json!({"type": "snapshot", "state": {"agents": [{"id": "aaaaaaaaaa", "name": "gpu-1"}],
        "frameworks": [{"id": "ffff", "name": "batch"}], "tasks": []}});
    assert_eq!(
        names.event(&snap),
        "snapshot: 1 agents, 1 frameworks, 0 active tasks"
    );
    let e = json!({"type": "task_updated", "name": "t", "task_id": "0123456789", "state": "KILLED",
                   "agent_id": "aaaaaaaaaa", "framework_id": "ffff", "reason": "preempted"});
    assert_eq!(
        names.event(&e),
        "task t (0123456789) KILLED on agent gpu-1 of batch [preempted]"
    );
    let added = json!({"type": "agent_added", "agent_id": "bbbb", "name": "cpu-9"});
    assert_eq!(names.event(&added), "agent_added cpu-9 (bbbb)");
    let e = json!({"type": "task_updated", "name": "u", "task_id": "1", "state": "RUNNING",
                   "agent_id": "bbbb", "reason": null});
    assert_eq!(names.event(&e), "task u (1) RUNNING on agent cpu-9");
}

#[test]
fn pages_show_names_times_and_whole_gpu_uuids() {
    let uuid = "GPU-5f2c7e4a-1b3d-4c5e-8f90-a1b2c3d4e5f6";
    let t = json!({"name": "train", "id": "t1", "state": "KILLED", "active": false,
        "reason": "drain-deadline", "message": "killed: the drain deadline of agent gpu-1 passed",
        "exit_code": null, "signal": 15, "framework_id": "f1", "framework_name": "batch",
        "agent_id": "a1", "agent_name": "gpu-1", "agent_hostname": "h1", "role": "eng",
        "user": null, "resources": {"gpus": 1.0}, "ports": [], "staged_at_ms": 0,
        "started_at_ms": null, "ended_at_ms": 1000, "gpus": [uuid],
        "gpu_devices": [{"uuid": uuid, "name": "A100", "memory_mib": 40960, "healthy": true,
                         "sample": null}]});
    let out = task(&t);
    assert!(out.contains("KILLED (completed)"), "{out}");
    assert!(out.contains("drain-deadline"), "{out}");
    assert!(out.contains("signal 15"), "{out}");
    assert!(out.contains("batch (f1)"), "{out}");
    assert!(out.contains("1970-01-01T00:00:01Z"), "{out}");
    assert!(out.contains(uuid), "{out}");
    let list = json!({"total": 1, "offset": 0, "tasks": [t]});
    assert!(tasks(&list).contains(uuid), "{}", tasks(&list));
    assert!(tasks(&list).contains("gpu-1"), "{}", tasks(&list));
    let o = json!([{"id": "o1", "framework_id": "f1", "framework_name": "batch", "agent_id": "a1",
        "agent_name": "gpu-1", "role": "eng", "resources": {"cpus": 2.0},
        "reserved": {"ml": {"cpus": 1.0}}, "age_ms": 1500}]);
    let out = offers(&o);
    assert!(
        out.contains("o1     batch      gpu-1  eng   cpus:2.0   ml=cpus:1.0  1.5s"),
        "{out}"
    );
}
