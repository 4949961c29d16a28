//! GPU discovery, sampling and the health watcher through nvml-wrapper loading the stand-in
//! NVML library (`cargo build -p gantry-nvml-standin` builds it; `cargo test -p gantry-agent`
//! builds it as a dev-dependency).

use std::path::Path;
use std::time::Duration;

use gantry_agent::discovery::nvml::{GpuProcess, NvmlGpus};
use gantry_agent::gpu::{assign, FaultKind};
use gantry_nvml_standin::config::{
    self, EventKind, EventSpec, GpuSpec, MigSpec, ProcessSpec, StandinConfig,
};
use gantry_proto::GpuInfo;

fn gpu(i: u32) -> GpuSpec {
    let a100 = i < 2;
    GpuSpec {
        uuid: format!("GPU-{i}1111111-2222-3333-4444-555555555555"),
        name: if a100 {
            "NVIDIA A100-SXM4-40GB"
        } else {
            "NVIDIA H100 80GB HBM3"
        }
        .to_string(),
        memory_mib: if a100 { 40960 } else { 81920 },
        minor: i,
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + i),
        // GPUs 0 and 2 on node 0, 1 and 3 on node 1; GPU 3's node only in sysfs.
        numa_node: if i == 3 { None } else { Some(i % 2) },
        compute_capability: if a100 { (8, 0) } else { (9, 0) },
        utilization_gpu: 20 + i,
        utilization_memory: 1,
        temperature_c: 50,
        power_mw: 250_000,
        memory_used_mib: None,
        processes: vec![],
        mig_devices: vec![],
    }
}

fn fake_sysfs(root: &Path) {
    let real = root.join("devices/pci0000:10/0000:10:01.0/0000:13:00.0");
    std::fs::create_dir_all(&real).unwrap();
    std::fs::write(real.join("numa_node"), "1\n").unwrap();
    std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
    std::os::unix::fs::symlink(&real, root.join("bus/pci/devices/0000:13:00.0")).unwrap();
}

async fn next_fault(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<gantry_agent::gpu::GpuFault>,
) -> Option<gantry_agent::gpu::GpuFault> {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .ok()
        .flatten()
}

/// One test function: the stand-in's configuration variable is process-wide.
#[tokio::test]
async fn discovery_sampling_and_health_through_standin() {
    let lib = config::library_path()
        .expect("stand-in NVML library built (cargo build -p gantry-nvml-standin)");
    let dir = tempfile::tempdir().unwrap();

    // Missing library: a CPU agent, no error.
    assert!(NvmlGpus::open(&dir.path().join("libnvidia-ml.so.1")).is_none());

    let path = dir.path().join("gpus.json");
    let mut cfg = StandinConfig {
        driver_version: "550.54.15".into(),
        cuda_version: 12040,
        gpus: (0..4).map(gpu).collect(),
        events: vec![],
        replay_events: true,
    };
    cfg.gpus[2].processes = vec![ProcessSpec {
        pid: 777,
        used_memory_mib: 300,
    }];
    config::write_atomic(&path, &cfg).unwrap();
    std::env::set_var(config::CONFIG_ENV, &path);
    let sysfs = dir.path().join("sys");
    fake_sysfs(&sysfs);

    let gpus = NvmlGpus::try_open(&lib, &sysfs).unwrap();
    let inv = gpus.inventory().clone();
    assert_eq!(inv.driver_version, "550.54.15");
    assert_eq!(inv.cuda_driver_version, "12.4");
    assert_eq!(inv.gpus.len(), 4);
    let infos = inv.infos();
    for (i, info) in infos.iter().enumerate() {
        let spec = &cfg.gpus[i];
        assert_eq!(info.uuid, spec.uuid);
        assert_eq!(info.name, spec.name);
        assert_eq!(info.memory_mib, spec.memory_mib);
        assert_eq!(info.compute_capability, spec.compute_capability);
        assert_eq!(info.minor, i as u32);
        assert_eq!(info.pci_bus_id, spec.pci_bus_id);
        assert_eq!(info.numa_node, Some(i as u32 % 2), "GPU {i}");
        assert!(info.healthy);
    }
    assert_eq!(
        inv.gpus[3].info.pci_root.as_deref(),
        Some("pci0000:10/0000:10:01.0")
    );
    assert_eq!(inv.gpus[0].info.pci_root, None);

    // Two GPUs for a task: the same NUMA node.
    let slots = inv.slots();
    let two = assign(&slots, 2).unwrap();
    assert_eq!(infos[two[0]].numa_node, infos[two[1]].numa_node);

    let samples = gpus.sample();
    assert_eq!(samples.len(), 4);
    assert_eq!(samples[1].util_percent, 21);
    assert_eq!(samples[2].mem_used_bytes, 300 << 20);
    assert_eq!(samples[0].power_mw, 250_000);
    assert_eq!(
        gpus.processes(),
        vec![GpuProcess {
            uuid: cfg.gpus[2].uuid.clone(),
            pid: 777,
            used_bytes: 300 << 20
        }]
    );
    assert!(gpus.recovery_check(&cfg.gpus[0].uuid));
    assert!(!gpus.recovery_check("GPU-unknown"));

    // Health: an application XID is ignored, a critical XID and a double-bit ECC error are not.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watcher = gpus.watch_health(tx);
    cfg.events = vec![
        EventSpec {
            id: Some(1),
            gpu: 1,
            kind: EventKind::Xid,
            xid: 13,
        },
        EventSpec {
            id: Some(2),
            gpu: 1,
            kind: EventKind::Xid,
            xid: 79,
        },
        EventSpec {
            id: Some(3),
            gpu: 2,
            kind: EventKind::SingleBitEcc,
            xid: 0,
        },
        EventSpec {
            id: Some(4),
            gpu: 3,
            kind: EventKind::DoubleBitEcc,
            xid: 0,
        },
    ];
    config::write_atomic(&path, &cfg).unwrap();
    let f = next_fault(&mut rx).await.unwrap();
    assert_eq!(
        (f.uuid.as_str(), f.kind),
        (cfg.gpus[1].uuid.as_str(), FaultKind::Xid(79))
    );
    let f = next_fault(&mut rx).await.unwrap();
    assert_eq!(
        (f.uuid.as_str(), f.kind),
        (cfg.gpus[3].uuid.as_str(), FaultKind::DoubleBitEcc)
    );
    assert!(tokio::time::timeout(Duration::from_millis(500), rx.recv())
        .await
        .is_err());
    watcher.stop();

    // Processes change at run time.
    cfg.gpus[0].processes = vec![ProcessSpec {
        pid: 1,
        used_memory_mib: 1,
    }];
    config::write_atomic(&path, &cfg).unwrap();
    assert_eq!(gpus.processes().len(), 2);
    drop(gpus);

    // MIG: GPU 3 in MIG mode with two slices. Its MIG devices are offered (MIG UUID, profile
    // parsed from the NVML name, their memory, the parent's topology); the parent itself is
    // not, but it is still sampled.
    cfg.events.clear();
    cfg.gpus[3].mig_devices = vec![
        MigSpec {
            uuid: "MIG-aaaaaaaa-0000-5000-8000-000000000001".into(),
            profile: "1g.10gb".into(),
            memory_mib: 9856,
        },
        MigSpec {
            uuid: "MIG-aaaaaaaa-0000-5000-8000-000000000002".into(),
            profile: "3g.40gb".into(),
            memory_mib: 40192,
        },
    ];
    config::write_atomic(&path, &cfg).unwrap();
    let gpus = NvmlGpus::try_open(&lib, &sysfs).unwrap();
    let inv = gpus.inventory().clone();
    assert_eq!(inv.gpus.len(), 5, "3 whole GPUs and 2 MIG devices");
    assert_eq!(inv.mig_parents.len(), 1);
    assert_eq!(inv.mig_parents[0].info.uuid, cfg.gpus[3].uuid);
    let migs: Vec<&GpuInfo> = inv
        .gpus
        .iter()
        .map(|g| &g.info)
        .filter(|i| i.mig_profile.is_some())
        .collect();
    assert_eq!(migs.len(), 2);
    assert_eq!(migs[0].uuid, "MIG-aaaaaaaa-0000-5000-8000-000000000001");
    assert_eq!(migs[0].mig_profile.as_deref(), Some("1g.10gb"));
    assert_eq!(migs[0].name, "NVIDIA H100 80GB HBM3 MIG 1g.10gb");
    assert_eq!(migs[0].memory_mib, 9856);
    assert_eq!(
        migs[0].parent_uuid.as_deref(),
        Some(cfg.gpus[3].uuid.as_str())
    );
    assert_eq!(migs[1].mig_profile.as_deref(), Some("3g.40gb"));
    assert_eq!(migs[1].minor, 3, "the parent's device node");
    assert_eq!(gpus.sample().len(), 4, "the physical GPUs are sampled");
    drop(gpus);
}
