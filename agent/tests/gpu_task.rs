//! The libraries wired together as the executor does it: discover 4 stand-in GPUs (two models,
//! two NUMA nodes), assign 2 to a task, isolate it in a real cgroup with only those GPUs'
//! device nodes, give it their UUIDs, and attribute NVML-reported GPU memory to it.
//!
//! Needs root and cgroups, like `tests/cgroups.rs` (`GANTRY_SKIP_CGROUP_TESTS=1` skips).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gantry_agent::discovery::nvml::NvmlGpus;
use gantry_agent::gpu::{self, assign};
use gantry_agent::isolation::{
    CgroupLayout, DeviceRule, IsolationMode, Isolator, Limits, NvidiaMajors, TaskCgroup,
};
use gantry_nvml_standin::config::{self, ProcessSpec, StandinConfig};

struct Cleanup(Isolator, Option<TaskCgroup>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(cg) = &self.1 {
            if let Err(e) = cg.destroy() {
                eprintln!("cleanup: {e}");
            }
        }
        let _ = self.0.remove_root();
    }
}

#[test]
fn two_gpu_task_on_one_numa_node_with_only_its_devices() {
    let lib = config::library_path().expect("stand-in NVML library built");
    let dir = tempfile::tempdir().unwrap();
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/nvml-standin/examples/four-gpus.toml");
    let mut cfg = StandinConfig::load(&example).unwrap();
    let cfg_path = dir.path().join("gpus.toml");
    config::write_atomic(&cfg_path, &cfg).unwrap();
    std::env::set_var(config::CONFIG_ENV, &cfg_path);

    // Discovery.
    let gpus = NvmlGpus::try_open(&lib, Path::new("/sys")).unwrap();
    let inv = gpus.inventory();
    assert_eq!(inv.gpus.len(), 4);
    let models: std::collections::BTreeSet<&str> =
        inv.gpus.iter().map(|g| g.info.name.as_str()).collect();
    assert_eq!(models.len(), 2);

    // Assignment: GPU 0 is busy, so the pair comes from node 1.
    let mut slots = inv.slots();
    slots[0].free = false;
    let picked = assign(&slots, 2).unwrap();
    assert_eq!(picked, vec![2, 3]);
    let chosen: Vec<_> = picked.iter().map(|&i| inv.gpus[i].info.clone()).collect();
    assert_eq!(chosen[0].numa_node, chosen[1].numa_node);
    let uuids: Vec<String> = chosen.iter().map(|g| g.uuid.clone()).collect();
    let minors: Vec<u32> = chosen.iter().map(|g| g.minor).collect();

    // Isolation.
    let root = PathBuf::from(format!("gantry-test-{}-gputask", std::process::id()));
    let iso = match Isolator::new(IsolationMode::Cgroups, Some(root)) {
        Ok(i) => i,
        Err(e) if std::env::var("GANTRY_SKIP_CGROUP_TESTS").as_deref() == Ok("1") => {
            eprintln!("SKIPPED: {e}");
            return;
        }
        Err(e) => panic!("cgroups are unavailable: {e}; set GANTRY_SKIP_CGROUP_TESTS=1 to skip"),
    };
    let mut guard = Cleanup(iso.clone(), None);
    let limits = Limits {
        cpus: 1.0,
        mem_mib: Some(64),
        pids_max: Some(100),
        cpu_hard_limit: false,
        devices: Some(DeviceRule::for_task(&minors, &NvidiaMajors::detect())),
    };
    let cg = iso.create("gpu-task", &limits).unwrap();
    guard.1 = Some(cg.clone());

    let attach = cg.pre_exec_attach();
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg("echo $CUDA_VISIBLE_DEVICES; echo $NVIDIA_VISIBLE_DEVICES; exec sleep 30")
        .envs(gpu::visible_devices_env(&uuids))
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    // SAFETY: attach_current only calls open/write/close.
    unsafe { cmd.pre_exec(move || attach.attach_current()) };
    let mut child = cmd.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), uuids.join(","));
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), uuids.join(","));

    // While it runs: its device cgroup lists exactly its GPUs among the NVIDIA nodes.
    if let Some(CgroupLayout::V1 { .. }) = iso.layout() {
        let list =
            std::fs::read_to_string(cg.controller_dir("devices").unwrap().join("devices.list"))
                .unwrap();
        let gpu_nodes: Vec<&str> = list
            .lines()
            .filter(|l| l.starts_with("c 195:") && !l.contains(":25"))
            .collect();
        assert_eq!(gpu_nodes, vec!["c 195:2 rwm", "c 195:3 rwm"]);
    }

    // Usage: NVML reports the task's process on one of its GPUs.
    let pid = child.id();
    assert!(cg.pids().unwrap().contains(&pid));
    cfg.gpus[picked[0]].processes = vec![ProcessSpec {
        pid,
        used_memory_mib: 512,
    }];
    cfg.gpus[picked[0]].utilization_gpu = 70;
    config::write_atomic(&cfg_path, &cfg).unwrap();
    let pid_task: HashMap<u32, &str> = cg
        .pids()
        .unwrap()
        .into_iter()
        .map(|p| (p, "gpu-task"))
        .collect();
    let assigned: HashMap<String, &str> = uuids.iter().map(|u| (u.clone(), "gpu-task")).collect();
    let usage = gpu::attribute(&gpus.sample(), &gpus.processes(), &pid_task, &assigned);
    assert_eq!(usage["gpu-task"].mem_bytes, 512 << 20);
    assert_eq!(usage["gpu-task"].util_percent, 70.0);

    let task_usage = cg.usage().unwrap();
    assert!(task_usage.mem_bytes > 0);
    assert!(!cg.oom_killed().unwrap());
    cg.destroy().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert!(iso.list().unwrap().is_empty());
}
