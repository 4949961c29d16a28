//! The bytes on the wire of one message of every family, pinned: moving a type between modules,
//! renaming a Rust field or reordering `impl`s must not change them. A change here is a
//! protocol change: bump `PROTOCOL_VERSION` and say what changed in docs/protocol.md, then
//! update the expected bytes (`GANTRY_PRINT_WIRE=1 cargo test -p gantry-proto --test wire --
//! --nocapture` prints them).

use std::collections::BTreeMap;

use gantry_proto::*;

fn gpu() -> GpuInfo {
    GpuInfo {
        uuid: "GPU-1".into(),
        name: "NVIDIA A100".into(),
        memory_mib: 81920,
        compute_capability: (8, 0),
        minor: 0,
        pci_bus_id: "0000:17:00.0".into(),
        numa_node: Some(1),
        healthy: true,
        mig_profile: None,
        parent_uuid: None,
        pci_root: Some("0000:16".into()),
    }
}

fn task() -> TaskInfo {
    let mut env = BTreeMap::new();
    env.insert("K".to_string(), "V".to_string());
    TaskInfo {
        task_id: TaskId::from_u128(3),
        name: "t".into(),
        command: CommandInfo::argv(["python3", "-c", "print(1)"]).with_user("alice"),
        resources: "cpus:1.5;mem:256;gpus:0.5".parse().unwrap(),
        env,
        kill_grace_secs: Some(2),
        gpu_selector: Some(GpuSelector {
            model: Some("A100".into()),
            min_memory_mib: Some(1024),
            mig_profile: None,
            uuids: vec!["GPU-1".into()],
        }),
        container: Some(Box::new(
            ContainerInfo::new("reg:5000/img:1")
                .with_volume(Volume::persistent("ckpt", "/ckpt"))
                .with_volume(Volume::host("/data", "/data").read_only()),
        )),
    }
}

fn update() -> StatusUpdate {
    StatusUpdate {
        update_id: UpdateId::from_u128(9),
        agent_id: Some(AgentId::from_u128(2)),
        reason: Some(TaskReason::AgentUnreachable),
        message: "m".into(),
        exit_code: Some(0),
        gpus: vec!["GPU-1".into()],
        timestamp_ms: 1_700_000_000_000,
        ports: vec![31000],
        ..StatusUpdate::new(
            TaskId::from_u128(3),
            FrameworkId::from_u128(1),
            TaskState::Unreachable,
        )
    }
}

/// One message of each family, with its name.
fn samples() -> Vec<(&'static str, Vec<u8>)> {
    let enc = |m: &dyn erased::Encode| m.bytes();
    let mut attributes = BTreeMap::new();
    attributes.insert("rack".to_string(), "r1".to_string());
    vec![
        (
            "hello",
            enc(&Hello {
                protocol_version: PROTOCOL_VERSION,
                peer: PeerKind::Agent,
            }),
        ),
        ("role", enc(&MasterRole::Leading { epoch: 4 })),
        (
            "register",
            enc(&AgentToMaster::Register {
                agent_id: Some(AgentId::from_u128(2)),
                hostname: "h".into(),
                resources: "cpus:4;mem:1024;gpus:1".parse().unwrap(),
                reserved: BTreeMap::new(),
                attributes: attributes.clone(),
                gpus: vec![gpu()],
                running_tasks: vec![RunningTask {
                    framework_id: FrameworkId::from_u128(1),
                    task: task(),
                    state: TaskState::Running,
                    gpus: vec!["GPU-1".into()],
                    ports: vec![31000],
                }],
                pending_updates: vec![update()],
                task_user: "nobody".into(),
            }),
        ),
        (
            "run_task",
            enc(&MasterToAgent::RunTask {
                framework_id: FrameworkId::from_u128(1),
                task: task(),
                gpus: vec!["GPU-1".into()],
            }),
        ),
        (
            "subscribe",
            enc(&FrameworkToMaster::Subscribe(FrameworkInfo {
                framework_id: Some(FrameworkId::from_u128(1)),
                name: "f".into(),
                roles: vec!["r".into()],
                capabilities: vec![Capability::GpuResources, Capability::PartitionAware],
                failover_timeout_secs: 60.0,
                min_allocatable: vec!["cpus:1".parse().unwrap()],
                suppressed_roles: vec!["r".into()],
            })),
        ),
        (
            "accept",
            enc(&FrameworkToMaster::Accept {
                offer_ids: vec![OfferId::from_u128(5)],
                operations: vec![Operation::Launch {
                    tasks: vec![task()],
                }],
                refuse_seconds: Some(1.0),
            }),
        ),
        (
            "offers",
            enc(&MasterToFramework::Offers(vec![Offer {
                id: OfferId::from_u128(5),
                framework_id: FrameworkId::from_u128(1),
                agent_id: AgentId::from_u128(2),
                hostname: "h".into(),
                role: "r".into(),
                resources: "cpus:4;mem:1024".parse().unwrap(),
                reserved: BTreeMap::new(),
                attributes: attributes.into(),
                gpus: vec![gpu()].into(),
                gpu_free: vec![GpuFree {
                    uuid: "GPU-1".into(),
                    free_milli: 500,
                    free_memory_mib: 40960,
                }],
                agent_name: "gpu-node-7".into(),
            }])),
        ),
        ("update", enc(&MasterToFramework::Update(update()))),
        (
            "kill_for",
            enc(&FrameworkToMaster::KillFor {
                task_id: TaskId::from_u128(3),
                reason: TaskReason::Preempted,
            }),
        ),
        (
            "accept_group",
            enc(&FrameworkToMaster::Accept {
                offer_ids: vec![OfferId::from_u128(5)],
                operations: vec![Operation::LaunchGroup {
                    group: TaskGroup::new("g", vec![task()]).with_policy(GroupPolicy::KillOnAnyEnd),
                }],
                refuse_seconds: None,
            }),
        ),
        (
            "set_demand",
            enc(&FrameworkToMaster::SetDemand {
                demands: vec![
                    Demand {
                        task: "cpus:1;gpus:1".parse().unwrap(),
                        count: 12,
                        gpu_model: None,
                    },
                    Demand {
                        task: "cpus:2;gpus:2".parse().unwrap(),
                        count: 2,
                        gpu_model: Some("H100".into()),
                    },
                ],
            }),
        ),
        (
            "run_task_group",
            enc(&MasterToAgent::RunTaskGroup {
                framework_id: FrameworkId::from_u128(1),
                group_id: "g".into(),
                policy: GroupPolicy::KillOnFailure,
                members: vec![GroupMember {
                    task: task(),
                    gpus: vec!["GPU-1".into()],
                }],
            }),
        ),
        (
            "sandbox_exec",
            enc(&SandboxRequest::Exec {
                task_id: TaskId::from_u128(3),
                command: vec!["sh".into(), "-c".into(), "id".into()],
                stdin: b"in".to_vec(),
                principal: "operator:admin".into(),
                timeout_secs: 30,
                tty: Some(TtySize {
                    rows: 33,
                    cols: 101,
                }),
            }),
        ),
        (
            "sandbox_data",
            enc(&SandboxReply::Data {
                offset: 7,
                data: b"hello".to_vec(),
                size: 12,
                eof: false,
            }),
        ),
        (
            "sandbox_exec_live",
            enc(&SandboxRequest::ExecLive {
                task_id: TaskId::from_u128(3),
                command: vec!["sh".into()],
                principal: "operator:admin".into(),
                timeout_secs: 0,
                tty: Some(TtySize { rows: 24, cols: 80 }),
            }),
        ),
        (
            "sandbox_input",
            enc(&SandboxInput::Resize(TtySize {
                rows: 40,
                cols: 132,
            })),
        ),
        (
            "destroy_volume",
            enc(&FrameworkToMaster::DestroyVolume {
                agent_id: AgentId::from_u128(2),
                name: "ckpt".into(),
            }),
        ),
        (
            "volume_destroyed",
            enc(&MasterToFramework::VolumeDestroyed(VolumeDestroyed {
                agent_id: AgentId::from_u128(2),
                name: "ckpt".into(),
                outcome: VolumeOutcome::InUse {
                    tasks: vec!["t1".into()],
                },
            })),
        ),
        (
            "sandbox_volume_destroy",
            enc(&SandboxRequest::Volume(VolumeRequest::Destroy {
                framework: "f".into(),
                name: "ckpt".into(),
                principal: "operator:admin".into(),
            })),
        ),
        (
            "sandbox_volume_list",
            enc(&SandboxReply::Volume(VolumeReply::List {
                volumes: vec![VolumeInfo {
                    framework: "f".into(),
                    name: "ckpt".into(),
                    path: "/v/f/ckpt".into(),
                    used_by: vec![],
                }],
                total: 1,
            })),
        ),
        (
            "agent_removed",
            enc(&MasterToFramework::AgentRemoved(AgentRemoved {
                agent_id: AgentId::from_u128(2),
                hostname: "h".into(),
                reason: "marked gone".into(),
            })),
        ),
        (
            "agents",
            enc(&MasterToFramework::Agents(vec![AgentSummary {
                agent_id: AgentId::from_u128(2),
                hostname: "h".into(),
                agent_name: "a".into(),
                resources: "cpus:8;gpus:1".parse().unwrap(),
                reserved: BTreeMap::from([("r".to_string(), "cpus:1".parse().unwrap())]),
                attributes: BTreeMap::from([("zone".to_string(), "z1".to_string())]),
                gpus: vec![gpu()],
            }])),
        ),
        (
            "subscribe_inventory",
            enc(&FrameworkToMaster::Subscribe(FrameworkInfo {
                framework_id: None,
                name: "q".into(),
                roles: vec!["r".into()],
                capabilities: vec![Capability::AgentInventory],
                failover_timeout_secs: 60.0,
                min_allocatable: vec![],
                suppressed_roles: vec![],
            })),
        ),
    ]
}

/// Encoding through a trait object, so the samples can be one list.
mod erased {
    pub trait Encode {
        fn bytes(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Encode for T {
        fn bytes(&self) -> Vec<u8> {
            gantry_proto::codec::encode(self).expect("encodes")
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// FNV-1a of the bytes: a short fingerprint to pin (the full hex is printed on a mismatch).
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| {
        (h ^ u64::from(*x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `(sample, length, FNV-1a)` of protocol v14 (v14: `MasterToFramework::Agents` and
/// `Capability::AgentInventory`; v13: `MasterToFramework::AgentRemoved`; v12:
/// persistent volumes,
/// `FrameworkToMaster::DestroyVolume`, `MasterToFramework::VolumeDestroyed`,
/// `SandboxRequest::Volume`, `SandboxReply::Volume`; v11: `SandboxRequest::ExecLive` and
/// `SandboxInput`; v9: the sandbox streams, `SandboxRequest` and
/// `SandboxReply`; v8: `FrameworkToMaster::KillFor` and the kill reasons;
/// task groups: `Operation::LaunchGroup`, `MasterToAgent::RunTaskGroup`; `SetDemand` with a list
/// of shapes).
const EXPECTED: &[(&str, usize, u64)] = &[
    ("hello", 2, 0x0846ec07b4fcc2e3),
    ("role", 2, 0x08328407b4eb6921),
    ("register", 396, 0x801cbdf1b2defc40),
    ("run_task", 173, 0xbf68fb3be82d20d8),
    ("subscribe", 48, 0xa220de7f1e3c47d6),
    ("accept", 179, 0x9cb255487cc244f3),
    ("offers", 163, 0xfcb3a39a21ef44f5),
    ("update", 100, 0x891e8c78f3d45229),
    ("kill_for", 19, 0xb203cdeeeb24b60c),
    ("accept_group", 174, 0x76535a4c515695f9),
    ("set_demand", 45, 0x2e09ba9efbbc1011),
    ("run_task_group", 177, 0x330a4dfc355079f8),
    ("sandbox_exec", 50, 0x537c9cf33b455766),
    ("sandbox_data", 10, 0x2f66684d55c96210),
    ("sandbox_exec_live", 41, 0xc6ad506733ef4a1d),
    ("sandbox_input", 3, 0xeb28741876537e29),
    ("destroy_volume", 23, 0x51dd456aea0a0aae),
    ("volume_destroyed", 28, 0xf825c8ed1b0450c4),
    ("sandbox_volume_destroy", 24, 0x45bc7fef61cb815c),
    ("sandbox_volume_list", 22, 0xe6000f6be0776e6f),
    ("agent_removed", 32, 0x16c902535d0c09c2),
    ("agents", 115, 0xba169dd3368b1b19),
    ("subscribe_inventory", 19, 0x853e4099e745b980),
];

#[test]
fn the_wire_bytes_of_every_family_are_unchanged() {
    let got = samples();
    if std::env::var_os("GANTRY_PRINT_WIRE").is_some() {
        for (name, b) in &got {
            println!("(\"{name}\", {}, 0x{:016x}),", b.len(), fnv(b));
        }
    }
    assert_eq!(got.len(), EXPECTED.len(), "one expectation per sample");
    for ((name, bytes), (want_name, len, sum)) in got.iter().zip(EXPECTED) {
        assert_eq!(name, want_name);
        assert_eq!(
            (bytes.len(), fnv(bytes)),
            (*len, *sum),
            "{name}: the wire bytes changed (a protocol change): {}",
            hex(bytes)
        );
    }
}
