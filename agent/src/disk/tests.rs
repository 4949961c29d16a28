//! The du-style walk on real files (hard links, symbolic links, sparse files, depth, a walk
//! spread over passes) and the verdict.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::*;

const MIB_U: u64 = 1024 * 1024;

/// Allocated bytes of one path (not following a link), as `du` counts them.
fn blocks(path: &Path) -> u64 {
    std::fs::symlink_metadata(path).unwrap().blocks() * 512
}

fn write_mib(path: &Path, mib: usize) {
    // Non-zero data, synced: its blocks are allocated whatever the file system.
    std::fs::write(path, vec![0xa5u8; mib * MIB_U as usize]).unwrap();
    std::fs::File::open(path).unwrap().sync_all().unwrap();
}

fn measure(dir: &Path) -> DiskReading {
    let mut walk = DuWalk::start(dir).unwrap();
    let r = walk.step(u64::MAX);
    assert!(r.complete);
    r
}

#[test]
fn a_hard_linked_file_counts_once() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    write_mib(&data, 2);
    for n in ["l1", "l2", "l3"] {
        std::fs::hard_link(&data, d.path().join(n)).unwrap();
    }
    let r = measure(d.path());
    assert_eq!(r.bytes, blocks(d.path()) + blocks(&data), "{r:?}");
    assert!(r.bytes >= 2 * MIB_U && r.bytes < 3 * MIB_U, "{r:?}");
    assert!(!r.too_deep);
}

#[test]
fn symbolic_links_are_counted_but_not_followed() {
    let outside = tempfile::tempdir().unwrap();
    write_mib(&outside.path().join("big"), 8);
    let d = tempfile::tempdir().unwrap();
    let links = [
        ("to-file", outside.path().join("big")),
        ("to-dir", outside.path().to_path_buf()),
        ("to-root", "/".into()),
        ("loop", "loop".into()),
    ];
    let mut expected = blocks(d.path());
    for (name, target) in &links {
        std::os::unix::fs::symlink(target, d.path().join(name)).unwrap();
        expected += blocks(&d.path().join(name));
    }
    let r = measure(d.path());
    assert_eq!(r.bytes, expected, "{r:?}");
    assert!(r.bytes < MIB_U, "{r:?}");
    // A sandbox that is itself a link is refused, not followed.
    let link = outside.path().join("sandbox-link");
    std::os::unix::fs::symlink(d.path(), &link).unwrap();
    assert!(DuWalk::start(&link).is_err());
}

#[test]
fn a_sparse_file_counts_its_blocks_not_its_length() {
    let d = tempfile::tempdir().unwrap();
    let sparse = d.path().join("sparse");
    let f = std::fs::File::create(&sparse).unwrap();
    f.set_len(1024 * MIB_U).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[1u8; 4096], 512 * MIB_U).unwrap();
    f.sync_all().unwrap();
    let r = measure(d.path());
    assert_eq!(r.bytes, blocks(d.path()) + blocks(&sparse), "{r:?}");
    assert!(r.bytes < MIB_U, "1 GiB long, 4 KiB written: {r:?}");
}

#[test]
fn a_walk_spread_over_passes_reads_lower_bounds_then_the_whole() {
    let d = tempfile::tempdir().unwrap();
    let mut expected = blocks(d.path());
    for i in 0..5 {
        let sub = d.path().join(format!("d{i}"));
        std::fs::create_dir(&sub).unwrap();
        expected += blocks(&sub);
        for j in 0..6 {
            let f = sub.join(format!("f{j}"));
            std::fs::write(&f, vec![7u8; 10_000 * (j + 1)]).unwrap();
            expected += blocks(&f);
        }
    }
    let mut walk = DuWalk::start(d.path()).unwrap();
    let mut passes = 0;
    let mut last = 0;
    let r = loop {
        let r = walk.step(4);
        passes += 1;
        assert!(r.bytes >= last, "readings only grow");
        assert!(r.bytes <= expected, "a lower bound: {r:?}");
        last = r.bytes;
        if r.complete {
            break r;
        }
        assert!(passes < 100, "the walk never ends");
    };
    // 35 entries at 4 a pass.
    assert!(passes >= 9, "{passes} passes");
    assert_eq!(r.bytes, expected);
    assert_eq!(walk.skipped(), 0);
}

#[test]
fn directories_nested_too_deep_are_flagged() {
    let d = tempfile::tempdir().unwrap();
    let mut p = d.path().to_path_buf();
    for _ in 0..MAX_DEPTH {
        p.push("d");
    }
    std::fs::create_dir_all(&p).unwrap();
    assert!(!measure(d.path()).too_deep, "{MAX_DEPTH} levels are walked");
    p.push("d");
    std::fs::create_dir(&p).unwrap();
    write_mib(&p.join("hidden"), 1);
    let r = measure(d.path());
    assert!(r.too_deep, "{r:?}");
    assert!(verdict(r, 100 * MIB_U, 100.0)
        .is_some_and(|m| m.starts_with("disk-limit:") && m.contains("deeper than 128 levels")));
}

#[test]
fn verdict_kills_only_past_the_limit() {
    let limit = limit_bytes(10_000);
    assert_eq!(limit, 10 * MIB_U);
    let reading = |bytes, complete| DiskReading {
        bytes,
        complete,
        too_deep: false,
    };
    assert_eq!(verdict(reading(limit, true), limit, 10.0), None);
    assert_eq!(verdict(reading(limit, false), limit, 10.0), None);
    assert_eq!(
        verdict(reading(64 * MIB_U, true), limit, 10.0).as_deref(),
        Some("disk-limit: the task used 64.0 MiB of its disk limit of 10 MiB; killed (--disk-enforcement du)")
    );
    // An unfinished walk already past the limit is enough.
    let partial = verdict(reading(limit + 1, false), limit, 10.0).unwrap();
    assert!(partial.contains("(at least"), "{partial}");
    // No disk resource: no limit, whatever the sandbox holds.
    assert_eq!(verdict(reading(u64::MAX, true), 0, 0.0), None);
    assert_eq!(limit_bytes(0), 0);
    assert_eq!(limit_bytes(500), MIB_U / 2);
    assert_eq!(limit_bytes(u64::MAX), u64::MAX);
}

#[test]
fn the_pass_budget_is_shared_with_a_floor() {
    assert_eq!(task_budget(0), PASS_BUDGET);
    assert_eq!(task_budget(4), PASS_BUDGET / 4);
    assert_eq!(task_budget(100_000), MIN_TASK_BUDGET);
    assert_eq!("du".parse(), Ok(DiskEnforcement::Du));
    assert_eq!("none".parse(), Ok(DiskEnforcement::None));
    assert!("xfs".parse::<DiskEnforcement>().is_err());
    assert_eq!(DiskEnforcement::default(), DiskEnforcement::Du);
}
