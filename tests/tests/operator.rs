//! Operator controls on a live cluster: weights and quotas through `gantryctl`, static and
//! dynamic reservations through agents and accepts.

use std::time::Duration;

use gantry_sdk::protocol::*;
use gantry_sdk::{Driver, DriverHandle, Scheduler};
use gantry_tests::Cluster;
use tokio::sync::mpsc;

/// `gantryctl` over HTTPS with the dev operator certificate the master issued.
fn gantryctl(cluster: &Cluster, args: &[&str]) -> std::process::Output {
    cluster.master.gantryctl(args).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_and_quotas_through_gantryctl() {
    let cluster = Cluster::start(&[("w1", "cpus:4;mem:1024")]).unwrap();
    let ok = gantryctl(&cluster, &["weight", "eng/ml", "3"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let bad = gantryctl(&cluster, &["weight", "eng", "-1"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("positive"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let q = gantryctl(
        &cluster,
        &[
            "quota",
            "eng",
            "--guarantee",
            "cpus:1",
            "--limit",
            "cpus:2;mem:512",
        ],
    );
    assert!(q.status.success(), "{}", String::from_utf8_lossy(&q.stderr));
    let bad = gantryctl(&cluster, &["quota", "eng", "--guarantee", "cpus:x"]);
    assert!(!bad.status.success());
    let s = cluster.master.state().unwrap();
    let roles = &s["allocator"]["roles"];
    assert_eq!(roles["eng/ml"]["weight"], 3.0, "{roles:#}");
    assert_eq!(roles["eng"]["quota_limit"]["cpus"], 2.0, "{roles:#}");
}

/// Reserves `cpus:2` for its role in the first offer, launching a task on them; reports every
/// offer it sees.
struct Reserver {
    role: String,
    reserved: bool,
    offers: mpsc::UnboundedSender<Offer>,
}

impl Scheduler for Reserver {
    async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
        for o in offers {
            let _ = self.offers.send(o.clone());
            if !self.reserved && o.resources.milli("cpus") >= 2000 {
                self.reserved = true;
                let task = TaskInfo {
                    task_id: TaskId::random(),
                    name: "on-reserved".into(),
                    command: "sleep 0.2".into(),
                    resources: "cpus:2;mem:64".parse().unwrap(),
                    env: Default::default(),
                    kill_grace_secs: None,
                    gpu_selector: None,
                    container: None,
                };
                let reserve = Operation::Reserve {
                    role: self.role.clone(),
                    resources: "cpus:2".parse().unwrap(),
                };
                driver.accept(
                    vec![o.id],
                    vec![reserve, Operation::Launch { tasks: vec![task] }],
                    Some(0.0),
                );
            } else {
                driver.decline(vec![o.id], Some(0.2));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_and_dynamic_reservations_reach_only_their_role() {
    let cluster = Cluster::start_with(
        &[("r1", "cpus:4;mem:1024")],
        &[],
        &["--reserve", "ml=cpus:1;mem:128"],
    )
    .unwrap();
    let s = cluster.master.state().unwrap();
    assert_eq!(s["agents"][0]["reserved"]["ml"]["cpus"], 1.0, "{s:#}");
    assert_eq!(s["agents"][0]["total"]["cpus"], 5.0);

    let (tx, mut offers) = mpsc::unbounded_channel();
    let cfg = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        "reserver",
        vec!["ml".into()],
    );
    let ml = tokio::spawn(Driver::new(cfg).run(Reserver {
        role: "ml".into(),
        reserved: false,
        offers: tx,
    }));
    // The ml framework sees the static reservation in its offers, then its dynamic one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut saw_static = false;
    let mut saw_dynamic = false;
    while !(saw_static && saw_dynamic) {
        let o = tokio::time::timeout_at(deadline, offers.recv())
            .await
            .expect("offers")
            .unwrap();
        let r = o.reserved.get("ml").map(|r| r.milli("cpus")).unwrap_or(0);
        saw_static |= r >= 1000;
        saw_dynamic |= r >= 3000;
    }
    let s = cluster.master.state().unwrap();
    assert_eq!(s["agents"][0]["reserved"]["ml"]["cpus"], 3.0, "{s:#}");

    // Another role is never offered the reserved cpus.
    let (tx2, mut other) = mpsc::unbounded_channel();
    let cfg = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        "other",
        vec!["web".into()],
    );
    let web = tokio::spawn(Driver::new(cfg).run(Reserver {
        role: "web".into(),
        reserved: true,
        offers: tx2,
    }));
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut seen = 0;
    while let Ok(Some(o)) = tokio::time::timeout_at(until, other.recv()).await {
        seen += 1;
        assert!(o.reserved.is_empty(), "{o:?}");
        assert!(o.resources.milli("cpus") <= 2000, "{o:?}");
    }
    assert!(seen > 0, "the web framework got no offers at all");
    ml.abort();
    web.abort();
}
