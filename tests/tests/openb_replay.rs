//! `gantry-master simulate --openb` on Alibaba's real openb trace (the FGD paper's experiment):
//! the real binary replays the default pod list for one seed and prints one JSON object with
//! the expected shape and sane values; a bad policy is a clear error; `--openb-compare` on the
//! smallest list gives a paired difference inside its own interval; `--live` replays it through
//! the master's state core with no accept refused, within a point of the cluster-wide number.
//!
//! The trace lives outside the repository (`shared/traces/alibaba-openb`, beside the clone or
//! higher up, or `$GANTRY_OPENB_DIR`); without it the test prints a note and passes.

use std::path::PathBuf;
use std::process::Command;

use gantry_tests::bin;

fn trace_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("GANTRY_OPENB_DIR") {
        return Some(PathBuf::from(dir));
    }
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .map(|a| a.join("shared/traces/alibaba-openb"))
        .find(|d| d.join("openb_node_list_gpu_node.csv").exists())
}

fn values(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .expect("a list")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect()
}

#[test]
fn openb_default_one_seed() {
    let Some(dir) = trace_dir() else {
        eprintln!("openb_replay: shared/traces/alibaba-openb not found; skipping");
        return;
    };
    let nodes = dir.join("openb_node_list_gpu_node.csv");
    let pods = dir.join("openb_pod_list_default.csv");
    let master = bin("gantry-master").unwrap();
    let out = Command::new(&master)
        .arg("simulate")
        .arg("--openb")
        .arg(&nodes)
        .arg(&pods)
        .args(["--seeds", "42", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["policy"], "fgd-blend",
        "the default policy (Policy::DEFAULT)"
    );
    assert_eq!(report["nodes"], 1213);
    assert_eq!(report["gpus"], 6212);
    assert_eq!(report["pod_list_tasks"], 8152);
    let mean = values(&report["mean_allocation_percent"]);
    assert_eq!(mean.len(), 131);
    assert_eq!(mean[0], 0.0);
    assert!(mean.windows(2).all(|w| w[0] <= w[1]), "{mean:?}");
    // Up to ~60% arrived nothing can fail on this cluster: allocated tracks arrived closely.
    assert!((mean[50] - 50.0).abs() < 1.0, "{}", mean[50]);
    // The paper's FGD reaches 95.2% at 100% arrived (mean of 10 seeds); one seed of ours must be
    // in that league (95.8%, the default's 30-seed mean in docs/benchmarks.md), and never
    // above capacity.
    assert!(mean[100] > 94.5 && mean[100] <= 100.0, "{}", mean[100]);
    assert!(mean[130] >= mean[100] && mean[130] <= 100.0);
    let seeds = report["seeds"].as_array().unwrap();
    assert_eq!(seeds.len(), 1);
    assert_eq!(seeds[0]["seed"], 42);
    assert_eq!(values(&seeds[0]["allocation_percent"]), mean);
    let arrived = seeds[0]["arrived_tasks"].as_u64().unwrap();
    let failed = seeds[0]["failed_tasks"].as_u64().unwrap();
    // 130% of capacity is requested: the list (8,152 tasks, ~98%) plus draws; some fail.
    assert!(arrived > 8152 && arrived < 14_000, "{arrived}");
    assert!(failed > 0 && failed < arrived / 4, "{failed}");
    let p50 = report["placement_us"]["p50"].as_f64().unwrap();
    let p99 = report["placement_us"]["p99"].as_f64().unwrap();
    assert!(p50 > 0.0 && p50 <= p99, "{p50} {p99}");

    // A policy that does not exist is refused with a clear message.
    let out = Command::new(&master)
        .arg("simulate")
        .arg("--openb")
        .arg(&nodes)
        .arg(&pods)
        .args(["--policy", "tetris"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown placement policy"), "{err}");

    // The paired comparison: the same two seeds through both policies on the smallest list;
    // per list one JSON object whose interval contains its mean difference.
    let small = dir.join("openb_pod_list_multigpu40.csv");
    let out = Command::new(&master)
        .arg("simulate")
        .arg("--openb")
        .arg(&nodes)
        .arg(&small)
        .args([
            "--openb-compare",
            "fgd-blend",
            "fgd",
            "--seeds",
            "42-43",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(c["list"], "multigpu40");
    assert_eq!(
        (c["a"].as_str(), c["b"].as_str()),
        (Some("fgd-blend"), Some("fgd"))
    );
    assert_eq!(values(&c["seeds"]), [42.0, 43.0]);
    for metric in ["at_100", "mean_50_130"] {
        let row = &c[metric];
        let (a, b, d) = (
            row["a"].as_f64().unwrap(),
            row["b"].as_f64().unwrap(),
            row["diff"].as_f64().unwrap(),
        );
        assert!((a - b - d).abs() < 1e-9, "{metric}: {row}");
        let ci = values(&row["ci95"]);
        assert!(ci[0] <= d && d <= ci[1], "{metric}: {row}");
        assert!(a > 90.0 || metric != "at_100", "{metric}: {row}");
        let n = row["a_above_b"].as_u64().unwrap() + row["a_below_b"].as_u64().unwrap();
        assert!(n <= 2);
    }
    // Progress goes to stderr, one line per seed.
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 2);
    // One policy is not a comparison.
    let out = Command::new(&master)
        .arg("simulate")
        .arg("--openb")
        .arg(&nodes)
        .arg(&small)
        .args(["--openb-compare", "fgd"])
        .output()
        .unwrap();
    assert!(!out.status.success());

    // The live replay: the same seed through the master's state core and allocator, a
    // framework placing across the offers it holds; no accept refused, and the allocation a
    // user gets within a point of the cluster-wide one.
    let out = Command::new(&master)
        .arg("simulate")
        .arg("--openb")
        .arg(&nodes)
        .arg(&small)
        .args(["--live", "--seeds", "42", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let live: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(live["list"], "multigpu40");
    assert_eq!(live["policy"], "fgd-blend");
    assert_eq!(live["seeds"][0]["refused_accepts"], 0, "{live}");
    assert!(
        live["seeds"][0]["offers"].as_u64().unwrap() > 1213,
        "{live}"
    );
    let row = &live["at_100"];
    let (l, w) = (
        row["live"].as_f64().unwrap(),
        row["cluster_wide"].as_f64().unwrap(),
    );
    assert!(w > 90.0 && (l - w).abs() <= 1.0, "{row}");
    // Two frameworks competing for the agents through the allocator: both launch, no accept
    // refused, reported beside the one-framework run of the same seed.
    let out = Command::new(&master)
        .arg("simulate")
        .arg("--openb")
        .arg(&nodes)
        .arg(&small)
        .args(["--live", "--frameworks", "2", "--seeds", "42", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let two: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let several = &two["several_frameworks"];
    assert_eq!(several["frameworks"], 2, "{two}");
    assert_eq!(several["seeds"][0]["refused_accepts"], 0, "{two}");
    let s = several["at_100"]["several"].as_f64().unwrap();
    assert!(s > 0.0 && s <= 100.0, "{several}");
    assert_eq!(two["at_100"]["live"].as_f64().unwrap(), l, "{two}");
    // --frameworks needs --live; 0 frameworks is refused.
    for args in [
        &["--frameworks", "2"][..],
        &["--live", "--frameworks", "0"][..],
    ] {
        let out = Command::new(&master)
            .arg("simulate")
            .arg("--openb")
            .arg(&nodes)
            .arg(&small)
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
    }
    // --live is not a comparison.
    let out = Command::new(&master)
        .arg("simulate")
        .arg("--openb")
        .arg(&nodes)
        .arg(&small)
        .args(["--live", "--openb-compare", "fgd", "fgd-scarce"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
