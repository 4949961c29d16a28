//! Scenario tests: every allocator feature, exercised black-box through the simulator on the
//! scenario files in `tests/scenarios/`, plus the `gantry-master simulate` binary itself, and the
//! conformance scenarios of issue 11 (`tests/conformance/`, a copy of
//! `../shared/scenarios/conformance/`) compared with their exact expected output.

use std::path::PathBuf;
use std::process::Command;

use gantry_master::simulate::scenario::{run_scenario, Scenario};
use gantry_master::simulate::SimError;
use serde_json::Value;

fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios")
        .join(name)
}

struct Run {
    offers: Vec<Value>,
    rescinds: Vec<Value>,
    summary: Value,
}

fn run(name: &str) -> Run {
    let text = std::fs::read_to_string(path(name)).unwrap();
    let scenario = Scenario::parse(&text).unwrap();
    let mut out = Vec::new();
    run_scenario(&scenario, &mut out).unwrap();
    let lines: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let summary = lines.last().unwrap()["summary"].clone();
    assert!(summary.is_object(), "last line is the summary");
    Run {
        offers: lines
            .iter()
            .filter(|l| l.get("offer").is_some())
            .cloned()
            .collect(),
        rescinds: lines
            .iter()
            .filter(|l| l.get("rescind").is_some())
            .cloned()
            .collect(),
        summary,
    }
}

fn run_err(text: &str) -> (String, SimError) {
    let scenario = Scenario::parse(text).unwrap();
    let mut out = Vec::new();
    let err = run_scenario(&scenario, &mut out).unwrap_err();
    (String::from_utf8(out).unwrap(), err)
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

fn offer<'a>(r: &'a Run, framework: &str, agent: &str) -> Vec<&'a Value> {
    r.offers
        .iter()
        .filter(|o| o["framework"] == framework && o["agent"] == agent)
        .collect()
}

fn share(r: &Run, kind: &str, name: &str) -> f64 {
    num(&r.summary[kind][name]["dominant_share"])
}

#[test]
fn drf_paper_example_converges_in_one_cycle() {
    let r = run("drf-paper-example.toml");
    assert_eq!(r.offers.len(), 2);
    let alice = offer(&r, "alice", "host1");
    let bob = offer(&r, "bob", "host1");
    assert_eq!(alice.len(), 1);
    assert_eq!(bob.len(), 1);
    assert_eq!(
        alice[0]["resources"],
        serde_json::json!({"cpus": 3.0, "mem": 12288.0})
    );
    assert_eq!(
        bob[0]["resources"],
        serde_json::json!({"cpus": 6.0, "mem": 2048.0})
    );
    assert_eq!(alice[0]["at_ms"], 10);
    for f in ["alice", "bob"] {
        assert!((share(&r, "frameworks", f) - 2.0 / 3.0).abs() < 1e-4, "{f}");
    }
    for role in ["a", "b"] {
        assert!(
            (share(&r, "roles", role) - 2.0 / 3.0).abs() < 1e-4,
            "{role}"
        );
    }
}

#[test]
fn public_scenario_file_matches_expected_result() {
    // The shared copy (beside the repository, where CI and developers have it) must behave
    // like ours.
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/scenarios/drf-paper-example.toml");
    let text = match std::fs::read_to_string(&shared) {
        Ok(t) => t,
        Err(_) => std::fs::read_to_string(path("drf-paper-example.toml")).unwrap(),
    };
    let mut out = Vec::new();
    let summary = run_scenario(&Scenario::parse(&text).unwrap(), &mut out).unwrap();
    assert!((summary.frameworks["alice"].dominant_share - 0.6667).abs() < 5e-5);
    assert!((summary.frameworks["bob"].dominant_share - 0.6667).abs() < 5e-5);
}

#[test]
fn static_reservations_go_only_to_their_role_and_subroles() {
    let r = run("reservations-static.toml");
    let web = offer(&r, "web", "host1");
    assert_eq!(web.len(), 1);
    assert_eq!(
        web[0]["resources"],
        serde_json::json!({"cpus": 4.0, "mem": 1000.0})
    );
    assert!(web[0].get("reserved").is_none());
    let trainer = offer(&r, "trainer", "host1");
    assert_eq!(trainer.len(), 1);
    assert_eq!(
        trainer[0]["reserved"],
        serde_json::json!({"ml": {"cpus": 4.0, "mem": 1000.0}})
    );
    // Reserved resources count toward the role (and its parent) share.
    assert!((share(&r, "roles", "ml") - 0.5).abs() < 1e-9);
    assert!((share(&r, "roles", "ml/train") - 0.5).abs() < 1e-9);
}

#[test]
fn dynamic_reserve_and_unreserve() {
    let r = run("reservations-dynamic.toml");
    assert_eq!(r.offers.len(), 4);
    // "other" (share 0) is first at 20 ms but gets only the unreserved part.
    assert_eq!(r.offers[1]["framework"], "other");
    assert_eq!(
        r.offers[1]["resources"],
        serde_json::json!({"cpus": 2.0, "mem": 300.0})
    );
    assert!(r.offers[1].get("reserved").is_none());
    assert_eq!(r.offers[2]["framework"], "db");
    assert_eq!(
        r.offers[2]["reserved"],
        serde_json::json!({"db": {"cpus": 1.0}})
    );
    // After UNRESERVE the cpu is unreserved and goes to "other" at the next batch.
    assert_eq!(r.offers[3]["framework"], "other");
    assert_eq!(r.offers[3]["at_ms"], 1000);
    assert_eq!(r.offers[3]["resources"], serde_json::json!({"cpus": 1.0}));
    assert!(r.offers[3].get("reserved").is_none());
}

#[test]
fn weights_scale_role_shares() {
    let r = run("weights.toml");
    assert_eq!(offer(&r, "fa", "host1")[0]["resources"]["cpus"], 6.0);
    assert_eq!(offer(&r, "fb", "host1")[0]["resources"]["cpus"], 3.0);
    assert!(
        (share(&r, "roles", "a") - 1.0 / 3.0).abs() < 1e-9,
        "weighted share"
    );
    assert!((share(&r, "roles", "b") - 1.0 / 3.0).abs() < 1e-9);
    assert!(
        (share(&r, "frameworks", "fa") - 2.0 / 3.0).abs() < 1e-9,
        "framework shares are not weighted"
    );
}

#[test]
fn quota_guarantee_is_held_back_until_its_role_arrives() {
    let r = run("quota-guarantee.toml");
    let greedy = offer(&r, "greedy", "host1");
    assert_eq!(greedy.len(), 1);
    assert_eq!(
        greedy[0]["resources"]["cpus"], 6.0,
        "4 of 10 cpus are headroom for q"
    );
    let q = offer(&r, "quota-fw", "host1");
    assert_eq!(q.len(), 1);
    assert_eq!(q[0]["at_ms"], 500);
    assert_eq!(q[0]["resources"]["cpus"], 4.0);
}

#[test]
fn quota_limit_splits_agents_and_can_be_raised() {
    let r = run("quota-limit.toml");
    let c = offer(&r, "c", "host1");
    assert_eq!(c[0]["resources"]["cpus"], 4.0);
    assert_eq!(
        c[0]["resources"]["mem"], 1000.0,
        "kinds not named in the limit are unlimited"
    );
    assert_eq!(offer(&r, "free", "host1")[0]["resources"]["cpus"], 3.0);
    // Raised to 8 at 1500 ms: the next batch offers the 3 remaining cpus (total 7 <= 8).
    assert_eq!(c.len(), 2);
    assert_eq!(c[1]["at_ms"], 2000);
    assert_eq!(c[1]["resources"]["cpus"], 3.0);
    assert!(num(&r.summary["roles"]["capped"]["allocated"]["cpus"]) <= 8.0);
}

#[test]
fn decline_filters_expire() {
    let r = run("filters.toml");
    let at: Vec<i64> = r
        .offers
        .iter()
        .map(|o| o["at_ms"].as_i64().unwrap())
        .collect();
    // Filtered from 100 to 2100: no offer at the 1000 and 2000 batches; refuse 0 at 3500
    // means re-offered at 4000.
    assert_eq!(at, vec![0, 3000, 4000]);
}

#[test]
fn suppress_stops_offers_until_revive_which_clears_filters() {
    let r = run("suppress-revive.toml");
    let at: Vec<i64> = r
        .offers
        .iter()
        .map(|o| o["at_ms"].as_i64().unwrap())
        .collect();
    assert_eq!(at, vec![1500, 3200]);
}

#[test]
fn offer_timeout_rescinds_unanswered_offers() {
    let r = run("offer-timeout.toml");
    assert_eq!(r.rescinds.len(), 1);
    assert_eq!(r.rescinds[0]["at_ms"], 500);
    assert_eq!(r.rescinds[0]["rescind"], r.offers[0]["offer"]);
    assert_eq!(r.rescinds[0]["framework"], "f");
    assert_eq!(r.rescinds[0]["agent"], "host1");
    assert_eq!(r.offers.len(), 2);
    assert_eq!(r.offers[1]["at_ms"], 1000);
}

#[test]
fn gpu_agents_only_go_to_gpu_capable_frameworks() {
    let r = run("gpu-filtering.toml");
    assert_eq!(offer(&r, "trainer", "gpu1").len(), 1);
    assert!(offer(&r, "plain", "gpu1").is_empty());
    assert_eq!(offer(&r, "plain", "cpu1").len(), 1);
    // Turned off: the GPU agent goes to the first framework by fair order (plain, by name).
    let text = std::fs::read_to_string(path("gpu-filtering.toml"))
        .unwrap()
        .replace(
            "allocation_interval_ms = 1000",
            "allocation_interval_ms = 1000\nfilter_gpu_resources = false",
        );
    let mut out = Vec::new();
    run_scenario(&Scenario::parse(&text).unwrap(), &mut out).unwrap();
    let first: Value =
        serde_json::from_str(String::from_utf8(out).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(first["framework"], "plain");
    assert_eq!(first["agent"], "gpu1");
}

#[test]
fn excluded_resources_do_not_count_toward_shares() {
    let r = run("fairness-exclusion.toml");
    assert!((share(&r, "frameworks", "gpu-user") - 0.125).abs() < 1e-9);
    assert!((share(&r, "frameworks", "cpu-user") - 0.375).abs() < 1e-9);
    assert_eq!(offer(&r, "gpu-user", "host1")[0]["resources"]["gpus"], 4.0);
}

#[test]
fn demand_aware_offers_converge_within_one_cycle() {
    let r = run("demand-convergence.toml");
    assert!(r.offers.iter().all(|o| o["at_ms"] == 0), "one cycle");
    let shares: Vec<f64> = ["cpu", "mem", "mixed"]
        .iter()
        .map(|f| share(&r, "frameworks", f))
        .collect();
    let (lo, hi) = shares
        .iter()
        .fold((f64::MAX, 0.0f64), |(l, h), s| (l.min(*s), h.max(*s)));
    // Within one task's dominant share of each other (the largest task is 1/16 of a host's mem).
    assert!(hi - lo <= 0.0625 + 1e-9, "{shares:?}");
    // Whole tasks only: cpu tasks are cpus:2;mem:1024, so cpus = 2 * mem/1024 in each offer.
    for o in r.offers.iter().filter(|o| o["framework"] == "cpu") {
        assert_eq!(
            num(&o["resources"]["cpus"]) * 512.0,
            num(&o["resources"]["mem"])
        );
    }
    // At most one offer per framework per agent.
    for f in ["cpu", "mem", "mixed"] {
        for a in ["h1", "h2"] {
            assert_eq!(offer(&r, f, a).len(), 1, "{f} on {a}");
        }
    }
}

#[test]
fn hierarchical_roles_share_at_each_level() {
    let r = run("hierarchical-roles.toml");
    assert!((share(&r, "roles", "eng") - 0.5).abs() < 1e-9);
    assert!((share(&r, "roles", "ops") - 0.5).abs() < 1e-9);
    assert!((share(&r, "roles", "eng/ml") - 0.25).abs() < 1e-9);
    assert!((share(&r, "roles", "eng/web") - 0.25).abs() < 1e-9);
}

#[test]
fn accept_recover_and_remove_agent() {
    let r = run("accept-recover.toml");
    let at: Vec<i64> = r
        .offers
        .iter()
        .map(|o| o["at_ms"].as_i64().unwrap())
        .collect();
    // Unused part filtered for 1 s (10..1010): back at the 2000 batch; recovered part at 2500.
    assert_eq!(at, vec![0, 2000, 2500]);
    assert_eq!(
        r.offers[1]["resources"],
        serde_json::json!({"cpus": 3.0, "mem": 3072.0})
    );
    assert_eq!(
        r.offers[2]["resources"],
        serde_json::json!({"cpus": 1.0, "mem": 1024.0})
    );
    assert_eq!(r.rescinds.len(), 2);
    assert!(r.rescinds.iter().all(|x| x["at_ms"] == 2600));
    assert_eq!(
        r.summary["frameworks"]["f"]["allocated"],
        serde_json::json!({})
    );
}

#[test]
fn events_naming_missing_things_stop_the_run_with_their_index() {
    let (out, err) = run_err(&std::fs::read_to_string(path("error-unknown-agent.toml")).unwrap());
    assert_eq!(
        out.lines().count(),
        1,
        "lines before the error stay printed"
    );
    let msg = err.to_string();
    assert!(msg.contains("event 2") && msg.contains("h2"), "{msg}");

    let base =
        "[[events]]\nat_ms = 0\nkind = \"add_framework\"\nframework = \"f\"\nroles = [\"r\"]\n";
    let cases = [
        ("[[events]]\nat_ms = 1\nkind = \"remove_framework\"\nframework = \"g\"\n", "no such framework \"g\""),
        ("[[events]]\nat_ms = 1\nkind = \"add_agent\"\nagent = \"h\"\nresources = \"cpus:1\"\n[[events]]\nat_ms = 2\nkind = \"accept\"\nframework = \"f\"\nagent = \"h\"\n[[events]]\nat_ms = 3\nkind = \"accept\"\nframework = \"f\"\nagent = \"h\"\n", "event 3 (accept): framework \"f\" has no outstanding offer"),
        ("[[events]]\nat_ms = 1\nkind = \"recover\"\nframework = \"f\"\nagent = \"nope\"\nresources = \"cpus:1\"\n", "no such agent"),
        ("[[events]]\nat_ms = 1\nkind = \"suppress\"\nframework = \"f\"\nrole = \"zzz\"\n", "not subscribed to role"),
    ];
    for (extra, want) in cases {
        let (_, err) = run_err(&format!("{base}{extra}"));
        assert!(
            err.to_string().contains(want),
            "{err} should contain {want}"
        );
    }
}

#[test]
fn malformed_scenarios_are_rejected_with_a_message() {
    for (text, want) in [
        (
            "[[events]]\nkind = \"add_agent\"\nagent = \"h\"\nresources = \"cpus:1\"\n",
            "missing at_ms",
        ),
        ("[[events]]\nat_ms = 0\nkind = \"explode\"\n", "event 0"),
        (
            "[[events]]\nat_ms = 0\nkind = \"add_agent\"\nagent = \"h\"\n",
            "event 0",
        ),
        ("[cluster]\nallocation_interval_ms = 0\n", "positive"),
        ("[cluster]\nbogus = 1\n", "bogus"),
    ] {
        let err = Scenario::parse(text).unwrap_err().to_string();
        assert!(err.contains(want), "{err} should contain {want}");
    }
    let (_, err) = run_err(
        "[[events]]\nat_ms = 0\nkind = \"add_agent\"\nagent = \"h\"\nresources = \"cpus:-1\"\n",
    );
    assert!(err.to_string().contains("event 0"), "{err}");
}

#[test]
fn binary_prints_json_lines_and_fails_on_bad_events() {
    let bin = env!("CARGO_BIN_EXE_gantry-master");
    let ok = Command::new(bin)
        .arg("simulate")
        .arg(path("drf-paper-example.toml"))
        .output()
        .unwrap();
    assert!(ok.status.success());
    let stdout = String::from_utf8(ok.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(
        lines[0].starts_with("{\"at_ms\":10,\"offer\":\""),
        "{}",
        lines[0]
    );
    assert!(lines[2].starts_with("{\"summary\":{\"roles\":"));

    let bad = Command::new(bin)
        .arg("simulate")
        .arg(path("error-unknown-agent.toml"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let stderr = String::from_utf8(bad.stderr).unwrap();
    assert!(stderr.contains("event 2"), "{stderr}");
    assert_eq!(String::from_utf8(bad.stdout).unwrap().lines().count(), 1);
}

#[test]
fn same_scenario_same_output() {
    let text = std::fs::read_to_string(path("demand-convergence.toml")).unwrap();
    let s = Scenario::parse(&text).unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    run_scenario(&s, &mut a).unwrap();
    run_scenario(&s, &mut b).unwrap();
    assert_eq!(a, b);
}

#[test]
fn trace_mode_runs_the_shipped_example_and_writes_csv() {
    let bin = env!("CARGO_BIN_EXE_gantry-master");
    let csv = std::env::temp_dir().join(format!("gantry-trace-{}.csv", std::process::id()));
    let out = Command::new(bin)
        .args(["simulate", "--trace"])
        .arg(path("trace-jobs.csv"))
        .arg("--cluster")
        .arg(path("trace-cluster.toml"))
        .arg("--csv")
        .arg(&csv)
        .output()
        .unwrap();
    let text = std::fs::read_to_string(&csv);
    let _ = std::fs::remove_file(&csv);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["jobs"], 120);
    assert_eq!(report["jobs_finished"], 120);
    assert!(num(&report["jain_fairness_mean"]) > 0.5);
    assert!(num(&report["job_completion_ms"]["p99"]) >= num(&report["job_completion_ms"]["p50"]));
    assert!(report["allocation_ms"]["cycles"].as_u64().unwrap() > 0);
    let text = text.unwrap();
    assert!(text.starts_with("t_ms,util_cpus,util_mem,share_role0,share_role1,share_role2,jain\n"));
    assert_eq!(
        text.lines().count(),
        report["series"].as_array().unwrap().len() + 1
    );
}

#[test]
fn long_quiet_stretches_are_skipped_not_iterated() {
    // One event a trillion milliseconds in: the run must not walk a billion empty batches.
    let text = "[[events]]\nat_ms = 0\nkind = \"add_framework\"\nframework = \"f\"\nroles = [\"r\"]\n\
                [[events]]\nat_ms = 0\nkind = \"add_agent\"\nagent = \"h\"\nresources = \"cpus:1\"\n\
                [[events]]\nat_ms = 1\nkind = \"decline\"\nframework = \"f\"\nagent = \"h\"\nrefuse_seconds = 3600\n\
                [[events]]\nat_ms = 1000000000000\nkind = \"add_agent\"\nagent = \"h2\"\nresources = \"cpus:1\"\n";
    let mut out = Vec::new();
    run_scenario(&Scenario::parse(text).unwrap(), &mut out).unwrap();
    let lines: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let at: Vec<i64> = lines
        .iter()
        .filter(|l| l.get("offer").is_some())
        .map(|l| l["at_ms"].as_i64().unwrap())
        .collect();
    // The filter (1 ms + 1 h) expires at 3,600,001 ms: re-offered at the next batch, then the
    // new agent at its event.
    assert_eq!(at, vec![0, 3_601_000, 1_000_000_000_000]);
}

// ---------------------------------------------------------------------------------------------
// Conformance scenarios (issue 11): each `NAME.toml` with its exact expected output
// `NAME.expected.jsonl` (offer ids left out, rescind ids `*`). Offers made at the same `at_ms` are
// compared as multisets of framework, agent, resources and reserved part, amounts within 1e-6;
// rescinds as multisets of (at_ms, framework, agent); the summary line exactly.

/// The repository's copy (always present).
fn conformance_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

/// The shared originals, beside the clone (`../shared/scenarios/conformance/` from the
/// repository root), where CI and developers have them.
fn shared_conformance_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/scenarios/conformance")
}

fn scenario_names(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".toml").map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// Amount maps (`{"cpus": 2.0}`) equal within 1e-6 (a missing kind is zero).
fn amounts_match(a: &Value, b: &Value) -> bool {
    let empty = serde_json::Map::new();
    let (a, b) = (
        a.as_object().unwrap_or(&empty),
        b.as_object().unwrap_or(&empty),
    );
    a.keys().chain(b.keys()).all(|k| {
        (num(a.get(k).unwrap_or(&Value::Null)) - num(b.get(k).unwrap_or(&Value::Null))).abs()
            <= 1e-6
    })
}

fn reserved_match(a: &Value, b: &Value) -> bool {
    let empty = serde_json::Map::new();
    let (a, b) = (
        a.as_object().unwrap_or(&empty),
        b.as_object().unwrap_or(&empty),
    );
    a.keys().chain(b.keys()).all(|k| {
        amounts_match(
            a.get(k).unwrap_or(&Value::Null),
            b.get(k).unwrap_or(&Value::Null),
        )
    })
}

fn offer_matches(actual: &Value, expected: &Value) -> bool {
    actual["at_ms"] == expected["at_ms"]
        && actual["framework"] == expected["framework"]
        && actual["agent"] == expected["agent"]
        && amounts_match(&actual["resources"], &expected["resources"])
        && reserved_match(&actual["reserved"], &expected["reserved"])
}

/// Compares a run's output with the expected lines; `Err` describes every difference.
fn compare_conformance(actual: &str, expected: &str) -> Result<(), String> {
    let parse = |text: &str| -> Vec<Value> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    };
    let (actual, expected) = (parse(actual), parse(expected));
    let mut problems = Vec::new();
    let kind = |v: &Value, k: &str| v.get(k).is_some();
    // Offers: multisets per at_ms.
    let mut unmatched: Vec<&Value> = actual.iter().filter(|l| kind(l, "offer")).collect();
    for e in expected
        .iter()
        .filter(|l| kind(l, "framework") && !kind(l, "rescind"))
    {
        match unmatched.iter().position(|a| offer_matches(a, e)) {
            Some(i) => {
                unmatched.remove(i);
            }
            None => problems.push(format!("missing offer {e}")),
        }
    }
    for a in unmatched {
        problems.push(format!("unexpected offer {a}"));
    }
    // Rescinds: multisets of (at_ms, framework, agent).
    let key = |v: &Value| {
        (
            v["at_ms"].clone(),
            v["framework"].clone(),
            v["agent"].clone(),
        )
    };
    let mut unmatched: Vec<&Value> = actual.iter().filter(|l| kind(l, "rescind")).collect();
    for e in expected.iter().filter(|l| kind(l, "rescind")) {
        match unmatched.iter().position(|a| key(a) == key(e)) {
            Some(i) => {
                unmatched.remove(i);
            }
            None => problems.push(format!("missing rescind {e}")),
        }
    }
    for a in unmatched {
        problems.push(format!("unexpected rescind {a}"));
    }
    // The summary, exactly.
    let summary = |lines: &[Value]| lines.iter().find(|l| kind(l, "summary")).cloned();
    let (a, e) = (summary(&actual), summary(&expected));
    if a != e {
        problems.push(format!(
            "summary differs:\n  actual   {}\n  expected {}",
            a.unwrap_or_default(),
            e.unwrap_or_default()
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Runs every scenario in `dir` and compares it with its expected output.
fn check_conformance_dir(dir: &std::path::Path) -> usize {
    let names = scenario_names(dir);
    let mut failures = Vec::new();
    for name in &names {
        let text = std::fs::read_to_string(dir.join(format!("{name}.toml"))).unwrap();
        let expected = std::fs::read_to_string(dir.join(format!("{name}.expected.jsonl"))).unwrap();
        let mut out = Vec::new();
        let result = Scenario::parse(&text).and_then(|s| run_scenario(&s, &mut out));
        let actual = String::from_utf8(out).unwrap();
        match result {
            Err(e) => failures.push(format!("{name}: the run failed: {e}")),
            Ok(_) => {
                if let Err(diff) = compare_conformance(&actual, &expected) {
                    failures.push(format!("{name}:\n{diff}\n-- actual output:\n{actual}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} conformance scenarios in {} differ:\n\n{}",
        failures.len(),
        names.len(),
        dir.display(),
        failures.join("\n\n")
    );
    names.len()
}

#[test]
fn conformance_scenarios_produce_their_expected_output() {
    let n = check_conformance_dir(&conformance_dir());
    assert!(
        n >= 10,
        "the repository has the conformance scenarios ({n})"
    );
}

#[test]
fn shared_conformance_scenarios_match_the_repository_copy_and_pass() {
    let shared = shared_conformance_dir();
    if !shared.is_dir() {
        eprintln!(
            "{} is absent: only the repository copy was checked",
            shared.display()
        );
        return;
    }
    check_conformance_dir(&shared);
    for name in scenario_names(&shared) {
        for file in [format!("{name}.toml"), format!("{name}.expected.jsonl")] {
            let ours = std::fs::read_to_string(conformance_dir().join(&file));
            let theirs = std::fs::read_to_string(shared.join(&file)).unwrap();
            assert_eq!(
                ours.ok().as_deref(),
                Some(theirs.as_str()),
                "master/tests/conformance/{file} is missing or differs from the shared copy"
            );
        }
    }
}

#[test]
fn the_conformance_comparison_can_fail() {
    let expected =
        "{\"agent\":\"a1\",\"at_ms\":0,\"framework\":\"f1\",\"resources\":{\"cpus\":2.0}}\n\
                    {\"summary\":{\"frameworks\":{},\"roles\":{}}}\n";
    let same = "{\"at_ms\":0,\"offer\":\"x\",\"framework\":\"f1\",\"agent\":\"a1\",\"resources\":{\"cpus\":2.0000001}}\n\
                {\"summary\":{\"roles\":{},\"frameworks\":{}}}\n";
    assert!(compare_conformance(same, expected).is_ok());
    let other_amount = same.replace("2.0000001", "2.5");
    assert!(compare_conformance(&other_amount, expected).is_err());
    let other_time = same.replace("\"at_ms\":0", "\"at_ms\":1000");
    assert!(compare_conformance(&other_time, expected).is_err());
    let reserved = same.replace(
        "\"resources\"",
        "\"reserved\":{\"r\":{\"cpus\":2.0}},\"resources\"",
    );
    assert!(compare_conformance(&reserved, expected).is_err());
    let extra = format!("{}\n{same}", same.lines().next().unwrap());
    assert!(compare_conformance(&extra, expected).is_err());
    let summary = same.replace("\"roles\":{}", "\"roles\":{\"r\":{}}");
    assert!(compare_conformance(&summary, expected).is_err());
}

#[test]
fn nested_guarantees_that_do_not_nest_stop_the_run_with_the_event_index() {
    let base = "[[roles]]\nname = \"r1\"\nquota_guarantee = \"cpus:2\"\n\
                [[roles]]\nname = \"r1/a\"\nquota_guarantee = \"cpus:1\"\n";
    // A sibling that would push the subroles' sum above the parent's guarantee.
    let (_, err) = run_err(&format!(
        "{base}[[events]]\nat_ms = 0\nkind = \"set_quota\"\nrole = \"r1/b\"\nguarantee = \"cpus:1.5\"\n"
    ));
    let msg = err.to_string();
    assert!(msg.contains("event 0") && msg.contains("r1"), "{msg}");
    // A parent lowered below its subroles' sum.
    let (_, err) = run_err(&format!(
        "{base}[[events]]\nat_ms = 0\nkind = \"add_framework\"\nframework = \"f\"\nroles = [\"r\"]\n\
         [[events]]\nat_ms = 5\nkind = \"set_quota\"\nrole = \"r1\"\nguarantee = \"cpus:0.5\"\n"
    ));
    let msg = err.to_string();
    assert!(msg.contains("event 1") && msg.contains("below"), "{msg}");
    // Declared roles are checked too, naming the role.
    let err = {
        let s = Scenario::parse(&format!(
            "{base}[[roles]]\nname = \"r1/a/deep\"\nquota_guarantee = \"cpus:1;mem:1\"\n"
        ))
        .unwrap();
        run_scenario(&s, &mut Vec::new()).unwrap_err().to_string()
    };
    assert!(err.contains("r1/a/deep"), "{err}");
    // Within the parent's guarantee is fine.
    let ok = format!(
        "{base}[[events]]\nat_ms = 0\nkind = \"set_quota\"\nrole = \"r1/b\"\nguarantee = \"cpus:1\"\n"
    );
    run_scenario(&Scenario::parse(&ok).unwrap(), &mut Vec::new()).unwrap();
}

#[test]
fn resource_seconds_integrate_allocations_over_simulated_time() {
    let r = run("resource-seconds.toml");
    let rs = &r.summary["resource_seconds"];
    assert_eq!(num(&rs["frameworks"]["train"]["gpus"]), 40.0, "{rs:#}");
    assert_eq!(num(&rs["frameworks"]["train"]["cpus"]), 160.0, "{rs:#}");
    assert_eq!(num(&rs["frameworks"]["etl"]["cpus"]), 80.0, "{rs:#}");
    assert_eq!(num(&rs["roles"]["eng/ml"]["gpus"]), 40.0, "{rs:#}");
    assert_eq!(num(&rs["roles"]["eng"]["cpus"]), 240.0, "{rs:#}");
    assert_eq!(num(&rs["roles"]["eng"]["gpus"]), 40.0, "{rs:#}");
    // Without the setting the summary has no such part (the conformance outputs are unchanged).
    assert!(run("drf-paper-example.toml").summary["resource_seconds"].is_null());
}
