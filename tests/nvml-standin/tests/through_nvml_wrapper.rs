//! Drives the built stand-in library through `nvml-wrapper`, exactly as the agent does.

use std::time::Duration;

use gantry_nvml_standin::config::{
    self, EventKind, EventSpec, GpuSpec, ProcessSpec, StandinConfig,
};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper::Nvml;

fn gpu(i: u32) -> GpuSpec {
    GpuSpec {
        uuid: format!("GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd"),
        name: if i < 2 {
            "NVIDIA A100-SXM4-40GB".into()
        } else {
            "NVIDIA H100 80GB HBM3".into()
        },
        memory_mib: if i < 2 { 40960 } else { 81920 },
        minor: i,
        pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + i),
        numa_node: Some(i / 2),
        compute_capability: if i < 2 { (8, 0) } else { (9, 0) },
        utilization_gpu: 10 * i,
        utilization_memory: 5,
        temperature_c: 40 + i,
        power_mw: 100_000 + i,
        memory_used_mib: None,
        processes: vec![],
        mig_devices: vec![],
    }
}

fn xid_kind(e: &EventData<'_>) -> Option<u64> {
    match e.event_data {
        Some(XidError::Value(v)) => Some(v),
        _ => None,
    }
}

/// One test: the library's state and the environment variable are process-wide.
#[test]
fn standin_answers_through_nvml_wrapper() {
    let lib =
        config::library_path().expect("libgantry_nvml_standin.so is built next to the test binary");
    let dir = tempfile::tempdir().unwrap();

    // Without configuration the library behaves like a host without a driver.
    std::env::remove_var(config::CONFIG_ENV);
    let err = Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .unwrap_err();
    assert!(matches!(err, NvmlError::DriverNotLoaded), "{err:?}");
    // A missing library is an error too, not a panic.
    assert!(Nvml::builder()
        .lib_path(dir.path().join("nope.so").as_os_str())
        .init()
        .is_err());

    let path = dir.path().join("gpus.toml");
    let mut cfg = StandinConfig {
        driver_version: "550.54.15".into(),
        cuda_version: 12040,
        gpus: (0..4).map(gpu).collect(),
        events: vec![],
        replay_events: true,
    };
    cfg.gpus[1].processes = vec![ProcessSpec {
        pid: 4242,
        used_memory_mib: 512,
    }];
    config::write_atomic(&path, &cfg).unwrap();
    std::env::set_var(config::CONFIG_ENV, &path);

    let nvml = Nvml::builder().lib_path(lib.as_os_str()).init().unwrap();
    assert_eq!(nvml.device_count().unwrap(), 4);
    assert_eq!(nvml.sys_driver_version().unwrap(), "550.54.15");
    assert_eq!(nvml.sys_cuda_driver_version().unwrap(), 12040);
    for i in 0..4u32 {
        let d = nvml.device_by_index(i).unwrap();
        let spec = &cfg.gpus[i as usize];
        assert_eq!(d.uuid().unwrap(), spec.uuid);
        assert_eq!(d.name().unwrap(), spec.name);
        assert_eq!(d.index().unwrap(), i);
        assert_eq!(d.minor_number().unwrap(), i);
        assert_eq!(
            d.memory_info().unwrap().total,
            spec.memory_mib * 1024 * 1024
        );
        let cc = d.cuda_compute_capability().unwrap();
        assert_eq!((cc.major, cc.minor), spec.compute_capability);
        assert_eq!(d.pci_info().unwrap().bus_id, spec.pci_bus_id);
        assert_eq!(d.pci_info().unwrap().bus, 0x10 + i);
        let aff = d.memory_affinity(1, 0).unwrap();
        assert_eq!(aff, vec![1 << (i / 2)]);
        assert_eq!(d.utilization_rates().unwrap().gpu, 10 * i);
        assert_eq!(d.temperature(TemperatureSensor::Gpu).unwrap(), 40 + i);
        assert_eq!(d.power_usage().unwrap(), 100_000 + i);
        assert!(d
            .supported_event_types()
            .unwrap()
            .contains(EventTypes::CRITICAL_XID_ERROR));
    }
    let d1 = nvml.device_by_index(1).unwrap();
    let procs = d1.running_compute_processes().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].pid, 4242);
    assert_eq!(
        procs[0].used_gpu_memory,
        UsedGpuMemory::Used(512 * 1024 * 1024)
    );
    assert_eq!(d1.memory_info().unwrap().used, 512 * 1024 * 1024);
    assert!(nvml.device_by_index(4).is_err());
    assert_eq!(
        nvml.device_by_uuid(cfg.gpus[2].uuid.as_str())
            .unwrap()
            .index()
            .unwrap(),
        2
    );

    // Events: none pending -> timeout; injected at run time -> delivered once.
    let set = nvml.create_event_set().unwrap();
    let set = d1
        .register_events(
            EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR,
            set,
        )
        .unwrap();
    assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));
    cfg.events = vec![
        EventSpec {
            id: Some(1),
            gpu: 1,
            kind: EventKind::Xid,
            xid: 79,
        },
        EventSpec {
            id: Some(2),
            gpu: 0,
            kind: EventKind::Xid,
            xid: 48,
        }, // not registered
        EventSpec {
            id: Some(3),
            gpu: 1,
            kind: EventKind::DoubleBitEcc,
            xid: 0,
        },
    ];
    cfg.gpus[1].processes.push(ProcessSpec {
        pid: 4343,
        used_memory_mib: 1,
    });
    config::write_atomic(&path, &cfg).unwrap();
    let e = set.wait(1000).unwrap();
    assert_eq!(e.device.index().unwrap(), 1);
    assert!(e.event_type.contains(EventTypes::CRITICAL_XID_ERROR));
    assert_eq!(xid_kind(&e), Some(79));
    let e = set.wait(1000).unwrap();
    assert!(e.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR));
    assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));
    assert_eq!(d1.running_compute_processes().unwrap().len(), 2);

    // Without replay, a new event set skips the events already listed, as real NVML would.
    cfg.replay_events = false;
    config::write_atomic(&path, &cfg).unwrap();
    let fresh = d1
        .register_events(
            EventTypes::CRITICAL_XID_ERROR,
            nvml.create_event_set().unwrap(),
        )
        .unwrap();
    assert!(matches!(fresh.wait(50), Err(NvmlError::Timeout)));
    cfg.events.push(EventSpec {
        id: Some(9),
        gpu: 1,
        kind: EventKind::Xid,
        xid: 94,
    });
    config::write_atomic(&path, &cfg).unwrap();
    assert_eq!(xid_kind(&fresh.wait(1000).unwrap()), Some(94));
    // The older set, created with replay, gets the new one too.
    assert_eq!(xid_kind(&set.wait(1000).unwrap()), Some(94));
    drop(fresh);

    // A half-written file keeps the last good configuration.
    std::fs::write(&path, "gpus = [").unwrap();
    assert_eq!(nvml.device_count().unwrap(), 4);
    drop(set);
    std::thread::sleep(Duration::from_millis(1));
    drop(nvml); // calls nvmlShutdown
}
