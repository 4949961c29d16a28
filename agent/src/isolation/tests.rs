//! Unit tests of cgroup isolation.

use super::*;

#[test]
fn cpu_conversions() {
    assert_eq!(cpu_shares(1.0), 1024);
    assert_eq!(cpu_shares(0.001), 2);
    assert_eq!(cpu_weight(1.0), 39);
    assert_eq!(cpu_weight(0.001), 1);
    assert_eq!(cpu_weight(1000.0), 10000);
    assert_eq!(cfs_quota_us(0.5), 50_000);
    assert_eq!(cfs_quota_us(0.0001), 1000);
}

#[test]
fn roots_and_ids_are_validated() {
    let m = Path::new("/sys/fs/cgroup");
    assert_eq!(
        relative_root(Path::new("gantry"), &[m]).unwrap(),
        PathBuf::from("gantry")
    );
    assert_eq!(
        relative_root(Path::new("/sys/fs/cgroup/a/b"), &[m]).unwrap(),
        PathBuf::from("a/b")
    );
    assert!(relative_root(Path::new("/elsewhere"), &[m]).is_err());
    assert!(relative_root(Path::new("../x"), &[m]).is_err());
    assert!(relative_root(Path::new("/sys/fs/cgroup"), &[m]).is_err());
    assert!(validate_task_id("0b7c-task_1.x").is_ok());
    for bad in ["", ".", "..", "a/b", "a b"] {
        assert!(validate_task_id(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn keyed_files() {
    let t = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
    assert_eq!(keyed(t, "oom_kill"), Some(3));
    assert_eq!(keyed(t, "missing"), None);
}

#[test]
fn none_mode_isolates_nothing() {
    let iso = Isolator::new(IsolationMode::None, None).unwrap();
    let limits = Limits {
        cpus: 1.0,
        mem_mib: Some(10),
        pids_max: None,
        cpu_hard_limit: true,
        devices: None,
    };
    let cg = iso.create("t1", &limits).unwrap();
    assert!(!cg.is_isolated());
    assert!(cg.pre_exec_attach().attach_current().is_ok());
    assert_eq!(cg.usage().unwrap(), TaskUsage::default());
    assert!(!cg.oom_killed().unwrap());
    cg.destroy().unwrap();
    assert!(iso.list().unwrap().is_empty());
}

/// A fake cgroup v2 file system in a temporary directory.
struct FakeV2 {
    dir: tempfile::TempDir,
}

impl FakeV2 {
    fn new(controllers: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path();
        std::fs::write(m.join("cgroup.controllers"), controllers).unwrap();
        std::fs::write(m.join("cgroup.subtree_control"), "").unwrap();
        std::fs::create_dir_all(m.join("gantry")).unwrap();
        std::fs::write(m.join("gantry/cgroup.controllers"), controllers).unwrap();
        std::fs::write(m.join("gantry/cgroup.subtree_control"), "").unwrap();
        FakeV2 { dir }
    }

    /// What the kernel would show in a new child cgroup.
    fn precreate_task(&self, id: &str) -> PathBuf {
        let d = self.dir.path().join("gantry").join(id);
        std::fs::create_dir_all(&d).unwrap();
        for (f, v) in [
            ("cgroup.procs", ""),
            ("cpu.weight", "100"),
            ("cpu.max", "max 100000"),
            (
                "cpu.stat",
                "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
            ),
            ("memory.max", "max"),
            ("memory.swap.max", "max"),
            ("memory.current", "1048576"),
            ("memory.peak", "4194304"),
            ("memory.events", "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n"),
            ("pids.max", "max"),
        ] {
            std::fs::write(d.join(f), v).unwrap();
        }
        d
    }

    fn isolator(&self) -> Isolator {
        Isolator::with_layout(
            CgroupLayout::V2 {
                mount: self.dir.path().to_path_buf(),
            },
            None,
        )
        .unwrap()
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap()
}

#[test]
fn v2_writes_limits_and_reads_usage() {
    let fake = FakeV2::new("cpuset cpu io memory pids");
    let d = fake.precreate_task("t1");
    let iso = fake.isolator();
    let limits = Limits {
        cpus: 0.5,
        mem_mib: Some(32),
        pids_max: Some(50),
        cpu_hard_limit: true,
        devices: None,
    };
    let cg = iso.create("t1", &limits).unwrap();
    // The fake directory existed (as a pool slot would): its counters are the baseline,
    // reset memory.peak through a descriptor. The task then runs: 2.5 s of CPU, one OOM
    // kill, a 4 MiB peak.
    assert_eq!(
        cg.baseline(),
        Baseline {
            oom_kills: 1,
            cpu_usec: 2_500_000
        }
    );
    std::fs::write(d.join("cpu.stat"), "usage_usec 5000000\n").unwrap();
    std::fs::write(d.join("memory.events"), "oom 2\noom_kill 2\n").unwrap();
    std::fs::write(d.join("memory.peak"), "4194304").unwrap();
    assert_eq!(read(&d.join("cpu.weight")), cpu_weight(0.5).to_string());
    assert_eq!(read(&d.join("cpu.max")), "50000 100000");
    assert_eq!(read(&d.join("memory.max")), (32u64 << 20).to_string());
    assert_eq!(read(&d.join("memory.swap.max")), "0");
    assert_eq!(read(&d.join("pids.max")), "50");
    // Controllers enabled on the way down (a real file would accumulate; ours keeps the last).
    assert!(read(&fake.dir.path().join("gantry/cgroup.subtree_control")).starts_with('+'));
    let u = cg.usage().unwrap();
    assert_eq!(u.cpu_time_secs, 2.5);
    assert_eq!((u.mem_bytes, u.mem_peak_bytes), (1 << 20, 4 << 20));
    assert!(cg.oom_killed().unwrap());
    // Only the kills counted before the task took the cgroup: not this task's OOM.
    std::fs::write(d.join("memory.events"), "oom 1\noom_kill 1\n").unwrap();
    assert!(!cg.oom_killed().unwrap());
    let a = cg.pre_exec_attach();
    assert_eq!(
        a.procs_files,
        vec![CString::new(d.join("cgroup.procs").as_os_str().as_bytes()).unwrap()]
    );
    assert_eq!(iso.list().unwrap(), vec!["t1".to_string()]);
    assert_eq!(iso.reopen("t1").unwrap().dirs(), vec![d.as_path()]);
    assert!(matches!(iso.reopen("t2"), Err(IsolationError::NotFound(_))));
    // A real cgroupfs directory has no regular files to remove; the fake one does.
    for e in std::fs::read_dir(&d).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    assert_eq!(iso.cleanup_except(&["t1"]).unwrap(), Vec::<String>::new());
    assert_eq!(iso.cleanup_except(&[]).unwrap(), vec!["t1".to_string()]);
    assert!(!d.exists());
    cg.destroy().unwrap(); // idempotent
}

#[test]
fn v2_reused_slot_gets_every_limit_rewritten() {
    let fake = FakeV2::new("cpuset cpu io memory pids");
    let d = fake.precreate_task("pool-x-1-0");
    let iso = fake.isolator();
    // The last task's limits are still there.
    std::fs::write(d.join("cpu.max"), "50000 100000").unwrap();
    std::fs::write(d.join("memory.max"), "33554432").unwrap();
    std::fs::write(d.join("memory.swap.max"), "0").unwrap();
    std::fs::write(d.join("pids.max"), "50").unwrap();
    let limits = Limits {
        cpus: 2.0,
        mem_mib: None,
        pids_max: None,
        cpu_hard_limit: false,
        devices: None,
    };
    let cg = iso.create("pool-x-1-0", &limits).unwrap();
    assert_eq!(read(&d.join("cpu.weight")), cpu_weight(2.0).to_string());
    assert_eq!(read(&d.join("cpu.max")), "max 100000");
    assert_eq!(read(&d.join("memory.max")), "max");
    assert_eq!(read(&d.join("memory.swap.max")), "max");
    assert_eq!(read(&d.join("pids.max")), "max");
    // Empty and made here: it may go back to the pool.
    cg.recycle().unwrap();
    // A reopened handle (an agent restart) does not know what it installed: removed.
    assert!(iso.reopen("pool-x-1-0").unwrap().recycle().is_err());
    // With processes in it: not pooled.
    std::fs::write(d.join("cgroup.procs"), "999999999\n").unwrap();
    assert!(matches!(cg.recycle(), Err(IsolationError::Busy { .. })));
}

/// Real cgroups (root on a host with cgroups, as in CI): a pool slot made ahead, taken with
/// limits, taken again without them (every limit back to unlimited), recycled, removed.
#[test]
fn pool_slot_reuse_on_this_host() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: real cgroups not tried");
        return;
    }
    let root = PathBuf::from(format!("gantry-unit-{}", std::process::id()));
    let iso = Isolator::new(IsolationMode::Cgroups, Some(root)).unwrap();
    let name = "pool-unit-1-0";
    iso.create_slot(name).unwrap();
    assert_eq!(iso.list().unwrap(), vec![name.to_string()]);
    let strict = Limits {
        cpus: 0.5,
        mem_mib: Some(32),
        pids_max: Some(20),
        cpu_hard_limit: true,
        devices: None,
    };
    let cg = iso.create(name, &strict).unwrap();
    let v2 = matches!(iso.layout(), Some(CgroupLayout::V2 { .. }));
    let file = |c: &str, v1: &str, v2f: &str| {
        let dir = cg.controller_dir(c).unwrap();
        read(&dir.join(if v2 { v2f } else { v1 }))
            .trim()
            .to_string()
    };
    assert_eq!(
        file("memory", "memory.limit_in_bytes", "memory.max"),
        (32u64 << 20).to_string()
    );
    assert_eq!(file("pids", "pids.max", "pids.max"), "20");
    let loose = Limits {
        cpus: 1.0,
        mem_mib: None,
        pids_max: None,
        cpu_hard_limit: false,
        devices: None,
    };
    let cg = iso.create(name, &loose).unwrap();
    let mem = file("memory", "memory.limit_in_bytes", "memory.max");
    assert!(
        mem == "max" || mem.parse::<u64>().unwrap() > 1 << 40,
        "{mem}"
    );
    assert_eq!(file("pids", "pids.max", "pids.max"), "max");
    if v2 {
        assert!(file("cpu", "", "cpu.max").starts_with("max"));
    } else {
        assert_eq!(file("cpu", "cpu.cfs_quota_us", ""), "-1");
        assert_eq!(file("cpuacct", "cpuacct.usage", ""), "0");
    }
    assert!(!cg.oom_killed().unwrap());
    cg.recycle().unwrap();
    // Taken again with the same limits: nothing to rewrite, and still right.
    let cg = iso.create(name, &loose).unwrap();
    assert_eq!(file("pids", "pids.max", "pids.max"), "max");
    assert_eq!(cg.usage().unwrap().cpu_time_secs, 0.0);
    // With other limits: rewritten.
    let cg = iso.create(name, &strict).unwrap();
    assert_eq!(file("pids", "pids.max", "pids.max"), "20");
    // A task that leaves 8 MiB of page cache charged: more than the next task (32 MiB limit)
    // may inherit, so taking the cgroup again reclaims it.
    let scratch = tempfile::tempdir().unwrap();
    let procs = cg.controller_dir("memory").unwrap().join("cgroup.procs");
    let status = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {} && head -c 8388608 /dev/zero > {}/cache",
            procs.display(),
            scratch.path().display()
        ))
        .status()
        .unwrap();
    assert!(status.success());
    let used = || {
        file("memory", "memory.usage_in_bytes", "memory.current")
            .parse::<u64>()
            .unwrap()
    };
    // The charge can show up in the usage a moment late on a busy host (CI saw 4 MiB or
    // less, then 8.7 MB on the next read): wait for it, for at most 5 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut charged = used();
    while charged <= leftover_allowance(&strict) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        charged = used();
    }
    assert!(charged > leftover_allowance(&strict), "{charged}");
    cg.recycle().unwrap();
    let cg = iso.create(name, &strict).unwrap();
    assert!(used() <= leftover_allowance(&strict), "{}", used());
    cg.recycle().unwrap();
    cg.destroy().unwrap();
    assert!(
        lock_slots(&iso.slots).is_empty(),
        "a removed slot is forgotten"
    );
    assert!(iso.list().unwrap().is_empty());
    iso.remove_root().unwrap();
}

#[test]
fn v2_missing_controller_is_a_clear_error() {
    let fake = FakeV2::new("cpu pids");
    fake.precreate_task("t1");
    let limits = Limits {
        cpus: 1.0,
        mem_mib: Some(32),
        pids_max: None,
        cpu_hard_limit: false,
        devices: None,
    };
    let err = fake.isolator().create("t1", &limits).unwrap_err();
    assert!(
        matches!(err, IsolationError::V2ControllerMissing { ref controller, .. } if controller == "memory"),
        "{err}"
    );
}

#[test]
fn v2_busy_directory_is_refused() {
    let fake = FakeV2::new("cpu memory pids");
    let d = fake.precreate_task("t1");
    // A pid above the kernel's maximum (4194304): never a real process.
    std::fs::write(d.join("cgroup.procs"), "999999999\n").unwrap();
    let limits = Limits {
        cpus: 1.0,
        mem_mib: None,
        pids_max: None,
        cpu_hard_limit: false,
        devices: None,
    };
    assert!(matches!(
        fake.isolator().create("t1", &limits),
        Err(IsolationError::Busy { .. })
    ));
}

#[test]
fn v1_requires_core_controllers() {
    let mut mounts = std::collections::BTreeMap::new();
    mounts.insert("cpu".to_string(), PathBuf::from("/x/cpu"));
    let err = Isolator::with_layout(CgroupLayout::V1 { mounts }, None).unwrap_err();
    assert!(matches!(err, IsolationError::ControllerMissing(_)));
}

/// Real cgroups (root): a process started with [`TaskCgroup::pre_exec_attach`] is in every
/// hierarchy of its task cgroup (v1: joined through `tasks`, the single-thread move, which
/// covers the whole of a freshly cloned process) and the starting process is in none.
#[test]
fn pre_exec_join_moves_the_whole_child_on_this_host() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: real cgroups not tried");
        return;
    }
    use std::os::unix::process::CommandExt;
    let root = PathBuf::from(format!("gantry-unit-join-{}", std::process::id()));
    let iso = Isolator::new(IsolationMode::Cgroups, Some(root)).unwrap();
    let limits = Limits {
        cpus: 0.5,
        mem_mib: Some(64),
        pids_max: Some(20),
        cpu_hard_limit: false,
        devices: None,
    };
    let cg = iso.create("join-1", &limits).unwrap();
    let v1 = matches!(iso.layout(), Some(CgroupLayout::V1 { .. }));
    let want = if v1 { "tasks" } else { "cgroup.procs" };
    assert!(!cg.join_files().is_empty());
    for f in cg.join_files() {
        assert_eq!(f.file_name().unwrap(), want, "{}", f.display());
    }
    let attach = cg.pre_exec_attach();
    let mut cmd = std::process::Command::new("/bin/sleep");
    cmd.arg("30");
    // SAFETY: attach_current only makes open/write/close system calls.
    unsafe { cmd.pre_exec(move || attach.attach_current()) };
    let mut child = cmd.spawn().unwrap();
    let pid = child.id();
    let me = std::process::id();
    let mut seen = Vec::new();
    for d in cg.dirs() {
        let procs = read_pids(&d.join("cgroup.procs")).unwrap();
        seen.push((d.to_path_buf(), procs.contains(&pid), procs.contains(&me)));
    }
    let _ = child.kill();
    let _ = child.wait();
    for (d, child_in, me_in) in seen {
        assert!(child_in, "the child is not in {}", d.display());
        assert!(!me_in, "the parent moved into {}", d.display());
    }
    cg.destroy().unwrap();
    iso.remove_root().unwrap();
}

#[test]
fn the_root_weighs_the_agents_cpus_and_ancestors_are_only_raised() {
    // v1: the `cpu` hierarchy only; `a` already heavier than asked, `b` lighter.
    let dir = tempfile::tempdir().unwrap();
    let mut mounts = std::collections::BTreeMap::new();
    for c in ["cpu", "cpuacct", "memory"] {
        std::fs::create_dir_all(dir.path().join(c)).unwrap();
        mounts.insert(c.to_string(), dir.path().join(c));
    }
    let cpu = dir.path().join("cpu");
    std::fs::create_dir_all(cpu.join("a/b/agent")).unwrap();
    std::fs::write(cpu.join("a/cpu.shares"), "300000").unwrap();
    std::fs::write(cpu.join("a/b/cpu.shares"), "1024").unwrap();
    std::fs::write(cpu.join("a/b/agent/cpu.shares"), "99999").unwrap();
    let iso = Isolator::with_layout(
        CgroupLayout::V1 {
            mounts: mounts.into_iter().collect(),
        },
        Some("a/b/agent".into()),
    )
    .unwrap();
    iso.weigh_root(64.0).unwrap();
    assert_eq!(read(&cpu.join("a/cpu.shares")), "300000", "never lowered");
    assert_eq!(read(&cpu.join("a/b/cpu.shares")), "65536", "raised");
    assert_eq!(
        read(&cpu.join("a/b/agent/cpu.shares")),
        "65536",
        "the root: exact"
    );
    assert!(
        !dir.path().join("memory/a").exists(),
        "only the cpu hierarchy"
    );
    // 1,000 CPUs: the kernel's largest weight.
    iso.weigh_root(1000.0).unwrap();
    assert_eq!(read(&cpu.join("a/b/agent/cpu.shares")), "262144");

    // v2: cpu.weight, the controller enabled down to the root.
    let fake = FakeV2::new("cpuset cpu io memory pids");
    let m = fake.dir.path();
    // (What the kernel shows once the parent enables `cpu`.)
    std::fs::write(m.join("gantry/cpu.weight"), "100").unwrap();
    fake.isolator().weigh_root(8.0).unwrap();
    assert_eq!(
        read(&m.join("gantry/cpu.weight")),
        cpu_weight(8.0).to_string()
    );
    assert!(read(&m.join("cgroup.subtree_control")).contains("+cpu"));
    // Without isolation: nothing to weigh.
    let none = Isolator::new(IsolationMode::None, None).unwrap();
    none.weigh_root(8.0).unwrap();
}
