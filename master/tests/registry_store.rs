//! The registry stores against real backends: etcd (started by the harness) with leadership
//! fencing, and the work-dir file store with its corruption handling.

mod common;

use std::time::Duration;

use common::*;
use gantry_master::election::{Fence, LeadershipEvent};
use gantry_master::registry::{
    AgentRecord, EtcdStore, FileStore, FrameworkRecord, GoneRecord, MaintenanceRecord, Mutation,
    Quota, Registry, RegistryError, RegistryStore, RegistryWriter, Reservation,
};
use gantry_proto::ids::{AgentId, FrameworkId};
use gantry_proto::resources::{ResourceLimits, Resources};

fn res(s: &str) -> Resources {
    Resources::parse(s).unwrap()
}

/// One record of every kind, including a hierarchical role with a `/`.
fn sample() -> Vec<Mutation> {
    let a1 = AgentId::from_u128(1);
    let a2 = AgentId::from_u128(2);
    vec![
        Mutation::PutAgent(AgentRecord {
            id: a1,
            name: "agent-1".into(),
            hostname: "node1.example".into(),
            deactivated: false,
        }),
        Mutation::PutAgent(AgentRecord {
            id: a2,
            name: "agent-2".into(),
            hostname: "node2.example".into(),
            deactivated: false,
        }),
        Mutation::SetWeight {
            role: "prod".into(),
            weight: 3.0,
        },
        Mutation::SetWeight {
            role: "prod/web".into(),
            weight: 0.5,
        },
        Mutation::SetQuota {
            role: "prod".into(),
            quota: Quota {
                guarantee: res("cpus:8;mem:16384;gpus:1"),
                limit: ResourceLimits::parse("cpus:16;mem:32768;gpus:4;disk:0").unwrap(),
            },
        },
        Mutation::SetReservation(Reservation {
            agent_id: a1,
            role: "prod/web".into(),
            resources: res("cpus:2.5;mem:1024"),
        }),
        Mutation::SetReservation(Reservation {
            agent_id: a2,
            role: "prod".into(),
            resources: res("gpus:1"),
        }),
        Mutation::PutFramework(FrameworkRecord {
            id: FrameworkId::from_u128(9),
            name: "batch".into(),
            roles: vec!["prod".into(), "prod/web".into()],
            principal: "batch-principal".into(),
            failover_timeout_secs: 120.0,
            partition_aware: false,
        }),
        Mutation::SetMaintenance(MaintenanceRecord {
            agent_id: a1,
            name: "agent-1".into(),
            started_unix_ms: 1_763_868_000_000,
            deadline_unix_ms: Some(1_763_868_600_000),
            drained: false,
            reason: "operator".into(),
        }),
        Mutation::PutGone(GoneRecord {
            agent_id: AgentId::from_u128(7),
            name: "agent-7".into(),
            at_unix_ms: 1_763_860_000_000,
        }),
    ]
}

fn expected(ms: &[Mutation]) -> Registry {
    let mut r = Registry::default();
    for m in ms {
        r.apply(m);
    }
    r
}

/// Waits for the election's Elected event and returns its fence.
async fn elected_fence(election: &mut gantry_master::election::Election) -> Fence {
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(10), election.next_event())
            .await
            .expect("elected in time")
            .expect("election running");
        if let LeadershipEvent::Elected { fence, .. } = ev {
            return fence;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_etcd_round_trip_with_readable_json() {
    let etcd = start_etcd();
    let p = prefix("registry-round-trip");
    let cfg = config(&etcd.client_url(), "a:5050", &p);
    let mut election = gantry_master::election::Election::etcd(cfg.clone()).unwrap();
    let store = RegistryStore::Etcd(
        EtcdStore::connect(&cfg.endpoints, &p, Duration::from_secs(2))
            .await
            .unwrap(),
    );
    // No fence yet: refused.
    assert!(matches!(
        store.apply(sample()[0].clone()).await,
        Err(RegistryError::Fenced(_))
    ));
    store.set_fence(elected_fence(&mut election).await);

    let ms = sample();
    for m in &ms {
        store.apply(m.clone()).await.unwrap();
    }
    assert_eq!(store.load().await.unwrap(), expected(&ms));

    // Fine-grained removal and an atomic batch.
    let mut want = expected(&ms);
    let reg = store.load().await.unwrap();
    store
        .remove_agent(AgentId::from_u128(2), &reg)
        .await
        .unwrap();
    want.apply(&Mutation::RemoveAgent(AgentId::from_u128(2)));
    want.apply(&Mutation::RemoveReservation {
        agent_id: AgentId::from_u128(2),
        role: "prod".into(),
    });
    store.remove_weight("prod/web").await.unwrap();
    want.apply(&Mutation::RemoveWeight {
        role: "prod/web".into(),
    });
    let batch = vec![
        Mutation::SetWeight {
            role: "dev".into(),
            weight: 1.5,
        },
        Mutation::SetWeight {
            role: "dev".into(),
            weight: 2.0,
        },
        Mutation::RemoveQuota {
            role: "prod".into(),
        },
    ];
    store.apply_all(&batch).await.unwrap();
    for m in &batch {
        want.apply(m);
    }
    let loaded = store.load().await.unwrap();
    assert_eq!(loaded, want);
    // Removing an agent removed its reservations too.
    assert!(!loaded.reservations.contains_key(&AgentId::from_u128(2)));

    // Values are plain JSON an operator can read with etcdctl.
    let mut client = etcd_client::Client::connect([etcd.client_url()], None)
        .await
        .unwrap();
    let key = format!("{p}/registry/frameworks/{}", FrameworkId::from_u128(9));
    let resp = client.get(key.as_str(), None).await.unwrap();
    let value: serde_json::Value = serde_json::from_slice(resp.kvs()[0].value()).unwrap();
    assert_eq!(value["principal"], "batch-principal");
    assert_eq!(value["failover_timeout_secs"], 120.0);

    // A damaged value is reported with its key, not silently skipped.
    let bad_key = format!("{p}/registry/agents/{}", AgentId::from_u128(3));
    client
        .put(bad_key.as_str(), "{not json", None)
        .await
        .unwrap();
    let err = store.load().await.unwrap_err();
    assert!(matches!(err, RegistryError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains(&bad_key), "{err}");
    election.resign(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_etcd_load_pages_through_many_records() {
    let etcd = start_etcd();
    let p = prefix("registry-paging");
    let cfg = config(&etcd.client_url(), "a:5050", &p);
    let mut election = gantry_master::election::Election::etcd(cfg.clone()).unwrap();
    let store = EtcdStore::connect(&cfg.endpoints, &p, Duration::from_secs(5))
        .await
        .unwrap();
    store.set_fence(elected_fence(&mut election).await);
    // 2,500 agents in batches of 100: more than two pages of 1,000.
    let all: Vec<Mutation> = (0..2500u128)
        .map(|i| {
            Mutation::PutAgent(AgentRecord {
                id: AgentId::from_u128(1000 + i),
                name: format!("agent-{i}"),
                hostname: format!("host-{i}"),
                deactivated: false,
            })
        })
        .collect();
    for chunk in all.chunks(100) {
        store.apply_all(chunk).await.unwrap();
    }
    let loaded = store.load().await.unwrap();
    assert_eq!(loaded.agents.len(), 2500);
    assert_eq!(loaded, expected(&all));
    // Too many operations for one etcd transaction are refused up front.
    let too_many: Vec<Mutation> = all.iter().take(129).cloned().collect();
    assert!(matches!(
        store.apply_all(&too_many).await,
        Err(RegistryError::Invalid(_))
    ));
    election.resign(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_writes_of_a_deposed_leader_are_fenced() {
    let etcd = start_etcd();
    let mut proxy =
        tokio::task::block_in_place(|| proxy::TcpProxy::start(etcd.client_addr())).unwrap();
    let p = prefix("registry-fence");
    let log = new_log();

    // a leads through the proxy; its registry store talks to etcd directly, so its writes can
    // still arrive after it was deposed (the dangerous case fencing exists for).
    let a = Node::start("a", config(&proxy.url(), "a:5050", &p), log.clone());
    assert!(wait_until(Duration::from_secs(10), || a.is_leader()).await);
    let fence_a = elections(&log, "a")[0].1.clone();
    let store_a = RegistryStore::Etcd(
        EtcdStore::connect(&[etcd.client_url()], &p, Duration::from_secs(2))
            .await
            .unwrap(),
    );
    store_a.set_fence(fence_a.clone());
    store_a.set_weight("prod", 2.0).await.unwrap();

    let b = Node::start("b", config(&etcd.client_url(), "b:5050", &p), log.clone());
    proxy.cut();
    assert!(wait_until(Duration::from_secs(15), || b.is_leader()).await);
    let fence_b = elections(&log, "b")[0].1.clone();
    assert_ne!(fence_a, fence_b);

    // The deposed leader's late write is refused with the typed error and changes nothing.
    let err = store_a.set_weight("prod", 99.0).await.unwrap_err();
    assert!(matches!(err, RegistryError::Fenced(_)), "{err}");

    let store_b = RegistryStore::Etcd(
        EtcdStore::connect(&[etcd.client_url()], &p, Duration::from_secs(2))
            .await
            .unwrap(),
    );
    // The new leader recovers what the old one wrote, then writes under its own fence.
    let recovered = store_b.load().await.unwrap();
    assert_eq!(recovered.weights.get("prod"), Some(&2.0));
    store_b.set_fence(fence_b);
    store_b.set_weight("prod", 4.0).await.unwrap();
    assert_eq!(
        store_b.load().await.unwrap().weights.get("prod"),
        Some(&4.0)
    );
    // A standalone fence never writes to etcd.
    store_a.set_fence(Fence::Standalone);
    assert!(matches!(
        store_a.set_weight("prod", 1.0).await,
        Err(RegistryError::Fenced(_))
    ));
    drop(a);
    drop(b);
}

#[tokio::test]
async fn registry_file_round_trip_and_corrupt_snapshot_is_an_error_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let ms = sample();
    {
        let store = RegistryStore::File(FileStore::open(dir.path()).unwrap());
        store.set_fence(Fence::Standalone);
        for m in &ms {
            store.apply(m.clone()).await.unwrap();
        }
        store
            .remove_reservation(AgentId::from_u128(2), "prod")
            .await
            .unwrap();
    }
    let mut want = expected(&ms);
    want.apply(&Mutation::RemoveReservation {
        agent_id: AgentId::from_u128(2),
        role: "prod".into(),
    });
    {
        let store = FileStore::open(dir.path()).unwrap();
        assert_eq!(store.load().await.unwrap(), want);
    }
    // Corrupt the snapshot: opening fails with a clear error and leaves the file as it was.
    let snap = dir.path().join("registry.json");
    let mut damaged = std::fs::read(&snap).unwrap();
    damaged.truncate(damaged.len() / 2);
    std::fs::write(&snap, &damaged).unwrap();
    let err = FileStore::open(dir.path())
        .err()
        .expect("corrupt snapshot refused");
    assert!(matches!(err, RegistryError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("registry.json"), "{err}");
    assert_eq!(
        std::fs::read(&snap).unwrap(),
        damaged,
        "corrupt file must not be overwritten"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_writer_group_commits_many_admissions_to_etcd() {
    let etcd = start_etcd();
    let p = prefix("registry-writer");
    let cfg = config(&etcd.client_url(), "a:5050", &p);
    let mut election = gantry_master::election::Election::etcd(cfg.clone()).unwrap();
    let store = RegistryStore::Etcd(
        EtcdStore::connect(&cfg.endpoints, &p, Duration::from_secs(5))
            .await
            .unwrap(),
    );
    store.set_fence(elected_fence(&mut election).await);
    let writer = RegistryWriter::spawn(store.clone());
    // 2,000 agents admitted one submission each, as a burst of registrations would.
    let pending: Vec<_> = (0..2000u128)
        .map(|i| {
            writer.submit(vec![Mutation::PutAgent(AgentRecord {
                id: AgentId::from_u128(i + 1),
                name: format!("agent-{i}"),
                hostname: format!("host-{i}"),
                deactivated: false,
            })])
        })
        .collect();
    for p in pending {
        p.await.unwrap();
    }
    assert_eq!(store.load().await.unwrap().agents.len(), 2000);
    let commits = writer
        .stats()
        .commits
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        commits < 200,
        "{commits} transactions for 2,000 submissions"
    );
    election.resign(Duration::from_secs(5)).await.unwrap();
}
