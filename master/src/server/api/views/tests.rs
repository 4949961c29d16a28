//! The `/api/v1` views against `/state` JSON: summaries, lookups, pages and task filters.

use super::*;

fn state() -> Value {
    json!({
        "leader": true, "epoch": 3, "uptime_ms": 10,
        "agents": [
            {"id": "a1", "name": "gpu-1", "connected": true, "active": true,
             "total": {"cpus": 4.0, "gpus": 2.0}, "used": {"cpus": 1.0, "gpus": 1.0},
             "gpus": [{"uuid": "G0", "healthy": true}, {"uuid": "G1", "healthy": false}],
             "gpu_samples": [{"uuid": "G0", "util_percent": 55}]},
            {"id": "a2", "name": "cpu-1", "connected": false, "active": false,
             "total": {"cpus": 2.5}, "used": {}, "gpus": [], "gpu_samples": []}
        ],
        "frameworks": [{"id": "f1", "name": "batch", "roles": ["eng"], "connected": true}],
        "tasks": [
            {"id": "t1", "name": "train", "state": "RUNNING", "framework_id": "f1", "agent_id": "a1", "gpus": ["G0"]},
            {"id": "t2", "name": "eval", "state": "STAGING", "framework_id": "f1", "agent_id": "a2", "gpus": []}
        ],
        "completed_tasks": [
            {"id": "t0", "name": "prep", "state": "FINISHED", "framework_id": "f1", "agent_id": "a1", "gpus": []}
        ],
        "completed_frameworks": [],
        "offers": [],
        "allocator": {"offers_made": 5, "roles": {
            "eng": {"weight": 2.0, "dominant_share": 0.25, "allocated": {"cpus": 1.0},
                    "offers_made": 3, "quota_guarantee": {"cpus": 1.0}, "quota_limit": null},
            "ops": {"weight": 1.0, "dominant_share": 0.0, "allocated": {},
                    "offers_made": 0, "quota_guarantee": null, "quota_limit": null}
        }}
    })
}

#[test]
fn summary_counts_agents_gpus_tasks_and_sums_resources() {
    let s = summary(&state());
    assert_eq!(s["agents"]["total"], 2);
    assert_eq!(s["agents"]["connected"], 1);
    assert_eq!(s["agents"]["deactivated"], 1);
    assert_eq!(s["gpus"]["total"], 2);
    assert_eq!(s["gpus"]["unhealthy"], 1);
    assert_eq!(s["tasks"]["by_state"]["RUNNING"], 1);
    assert_eq!(s["tasks"]["completed"], 1);
    assert_eq!(s["resources"]["total"]["cpus"], 6.5);
    assert_eq!(s["offers"]["made"], 5);
}

#[test]
fn agents_join_gpus_with_samples_and_holders() {
    let a = agents(&state());
    let g0 = &a[0]["gpus"][0];
    assert_eq!(g0["sample"]["util_percent"], 55);
    assert_eq!(g0["tasks"][0]["name"], "train");
    assert!(a[0]["gpus"][1]["sample"].is_null());
    assert!(a[0].get("gpu_samples").is_none());
    assert!(a[0]["drain"].is_null());
}

#[test]
fn agents_and_frameworks_are_found_by_id_or_name() {
    let s = state();
    assert_eq!(find_agent(&s, "cpu-1").unwrap()["id"], "a2");
    assert_eq!(find_agent(&s, "a1").unwrap()["name"], "gpu-1");
    assert!(find_agent(&s, "nope").is_none());
    assert_eq!(find_framework(&s, "batch").unwrap()["id"], "f1");
}

#[test]
fn tasks_filter_and_paginate() {
    let s = state();
    let all = tasks(&s, &TaskQuery::default()).unwrap();
    assert_eq!(all["total"], 3);
    let running = tasks(
        &s,
        &TaskQuery {
            state: Some("running".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(running["total"], 1);
    assert_eq!(running["tasks"][0]["id"], "t1");
    let on_gpu1 = tasks(
        &s,
        &TaskQuery {
            agent: Some("gpu-1".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(on_gpu1["total"], 2);
    let page = tasks(
        &s,
        &TaskQuery {
            limit: Some(1),
            offset: Some(1),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(page["total"], 3);
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(page["tasks"][0]["id"], "t2");
    let active = tasks(
        &s,
        &TaskQuery {
            completed: Some(false),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(active["total"], 2);
    let huge = tasks(
        &s,
        &TaskQuery {
            limit: Some(1_000_000),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(huge["limit"], MAX_PAGE);
}

#[test]
fn roles_quotas_weights_and_maintenance() {
    let s = state();
    let r = roles(&s);
    assert_eq!(r[0]["name"], "eng");
    assert_eq!(r[0]["frameworks"][0], "f1");
    assert_eq!(quotas(&s).as_array().unwrap().len(), 1);
    let w = weights(&s);
    assert_eq!(w.as_array().unwrap().len(), 1);
    assert_eq!(w[0]["weight"], 2.0);
    let m = maintenance(&s);
    assert_eq!(m["agents"][0]["name"], "cpu-1");
}

#[test]
fn task_filters_that_name_nothing_are_errors() {
    let s = state();
    let q = |state: Option<&str>, framework: Option<&str>, agent: Option<&str>| TaskQuery {
        state: state.map(Into::into),
        framework: framework.map(Into::into),
        agent: agent.map(Into::into),
        ..Default::default()
    };
    let e = tasks(&s, &q(Some("bogus"), None, None)).unwrap_err();
    assert!(e.contains("RUNNING") && e.contains("\"bogus\""), "{e}");
    let e = tasks(&s, &q(None, Some("nope"), None)).unwrap_err();
    assert!(e.contains("the frameworks are: batch"), "{e}");
    let e = tasks(&s, &q(None, None, Some("nope"))).unwrap_err();
    assert!(e.contains("cpu-1") && e.contains("gpu-1"), "{e}");
    // Names work where ids do, and each task carries the names.
    let by_name = tasks(&s, &q(None, Some("batch"), Some("gpu-1"))).unwrap();
    assert_eq!(by_name["total"], 2);
    assert_eq!(by_name["tasks"][0]["framework_name"], "batch");
    assert_eq!(by_name["tasks"][0]["agent_name"], "gpu-1");
}

#[test]
fn tasks_are_found_by_id_or_unique_name() {
    let mut s = state();
    assert_eq!(lookup_task(&s, "t1").unwrap()["name"], "train");
    assert_eq!(lookup_task(&s, "prep").unwrap()["id"], "t0");
    assert_eq!(lookup_task(&s, "nope"), Err(Lookup::NotFound));
    s["tasks"][1]["name"] = json!("train");
    assert_eq!(
        lookup_task(&s, "train"),
        Err(Lookup::Ambiguous(vec!["t1".into(), "t2".into()]))
    );
    let msg = Lookup::Ambiguous(vec!["t1".into()]).message("task", "train");
    assert!(msg.contains("name one by its id"), "{msg}");
}

#[test]
fn pages_join_names_gpus_tasks_and_offers() {
    let mut s = state();
    s["agents"][0]["gpus"][0]["name"] = json!("NVIDIA A100-SXM4-80GB");
    s["offers"] = json!([{"id": "o1", "framework_id": "f1", "agent_id": "a2"}]);
    let t = task_page(&s, lookup_task(&s, "t1").unwrap());
    assert_eq!(t["active"], true);
    assert_eq!(t["agent_name"], "gpu-1");
    assert_eq!(t["framework_name"], "batch");
    assert_eq!(t["gpu_devices"][0]["uuid"], "G0");
    assert_eq!(t["gpu_devices"][0]["name"], "NVIDIA A100-SXM4-80GB");
    assert_eq!(t["gpu_devices"][0]["sample"]["util_percent"], 55);
    let done = task_page(&s, lookup_task(&s, "t0").unwrap());
    assert_eq!(done["active"], false);
    let a = agent_page(&s, find_agent(&s, "cpu-1").unwrap());
    assert_eq!(a["tasks"][0]["name"], "eval");
    assert_eq!(a["tasks"][0]["framework_name"], "batch");
    assert_eq!(a["offers"][0]["framework_name"], "batch");
    let f = framework_page(&s, lookup_framework(&s, "batch").unwrap());
    assert_eq!(f["completed"], false);
    assert_eq!(f["tasks"].as_array().unwrap().len(), 2);
    assert_eq!(f["completed_tasks"][0]["name"], "prep");
    assert_eq!(f["completed_tasks"][0]["agent_name"], "gpu-1");
    assert_eq!(f["offers"][0]["agent_name"], "cpu-1");
    assert_eq!(f["role_details"][0]["name"], "eng");
    assert_eq!(offers(&s)[0]["agent_name"], "cpu-1");
    s["completed_frameworks"] = json!([{"id": "f0", "name": "old", "reason": "torn down"}]);
    let old = framework_page(&s, lookup_framework(&s, "old").unwrap());
    assert_eq!(old["completed"], true);
}

#[test]
fn a_limit_below_what_tasks_hold_warns() {
    let mut s = state();
    s["tasks"][0]["role"] = json!("eng/ml");
    s["tasks"][0]["resources"] = json!({"cpus": 3.0, "mem": 64.0});
    s["tasks"][1]["role"] = json!("eng");
    s["tasks"][1]["resources"] = json!({"cpus": 1.0});
    let w = limit_warnings(&s, "eng", &"cpus:2;mem:1024".parse().unwrap());
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("cpus:2") && w[0].contains("cpus:4"), "{w:?}");
    assert!(limit_warnings(&s, "eng", &"cpus:4".parse().unwrap()).is_empty());
    assert!(limit_warnings(&s, "ops", &"cpus:0".parse().unwrap()).is_empty());
}
