use gantry_proto::{
    AgentId, FrameworkId, StatusUpdate, TaskId, TaskInfo, TaskState, UpdateId, UpdateSource,
};

use super::*;
use crate::checkpoint::{TaskRecord, FILE};

fn task(state: TaskState) -> TaskRecord {
    let id = TaskId::random();
    TaskRecord {
        framework_id: FrameworkId::random(),
        info: TaskInfo {
            task_id: id,
            name: "t".into(),
            command: "true".into(),
            resources: "cpus:0.1".parse().unwrap(),
            env: Default::default(),
            kill_grace_secs: None,
            gpu_selector: None,
            container: None,
        },
        state,
        sandbox: PathBuf::from("/s"),
        meta: PathBuf::from("/m"),
        launched: None,
        gpus: vec![],
        kill_requested_ms: None,
        cgroup: None,
        gpu_memory_kill: None,
        disk_kill: None,
        ports: Vec::new(),
        group: None,
    }
}

fn update(t: &TaskRecord, state: TaskState) -> StatusUpdate {
    StatusUpdate {
        update_id: UpdateId::random(),
        task_id: t.info.task_id,
        framework_id: t.framework_id,
        agent_id: None,
        state,
        source: UpdateSource::Agent,
        reason: None,
        message: String::new(),
        exit_code: None,
        signal: None,
        gpus: vec![],
        timestamp_ms: 0,
        reconciliation: false,
        ports: Vec::new(),
    }
}

/// A task's life in records: staged, running (update), finished (update), acked twice, gone.
fn life(t: &TaskRecord) -> Vec<Vec<Record>> {
    let running = update(t, TaskState::Running);
    let finished = update(t, TaskState::Finished);
    let mut r = t.clone();
    r.state = TaskState::Running;
    let mut f = t.clone();
    f.state = TaskState::Finished;
    vec![
        vec![Record::Task(Box::new(t.clone()))],
        vec![
            Record::Task(Box::new(r)),
            Record::Update(Box::new(running.clone())),
        ],
        vec![
            Record::Task(Box::new(f)),
            Record::Update(Box::new(finished.clone())),
        ],
        vec![Record::Acked {
            task: t.info.task_id,
            update: running.update_id,
        }],
        vec![
            Record::Acked {
                task: t.info.task_id,
                update: finished.update_id,
            },
            Record::TaskRemoved(t.info.task_id),
        ],
    ]
}

#[test]
fn every_cut_of_a_log_recovers_a_prefix_of_its_batches() {
    let t = task(TaskState::Staging);
    let batches = life(&t);
    let mut data = Vec::new();
    let mut ends = Vec::new();
    for b in &batches {
        encode_frame(b, &mut data);
        ends.push(data.len());
    }
    let path = Path::new("wal-test.log");
    for cut in 0..=data.len() {
        let d = decode_log(path, &data[..cut]).unwrap();
        let whole = ends.iter().filter(|&&e| e <= cut).count();
        assert_eq!(d.batches.len(), whole, "cut at {cut}");
        assert_eq!(d.batches[..], batches[..whole]);
        let last_end = if whole == 0 { 0 } else { ends[whole - 1] };
        assert_eq!(d.torn_bytes, cut - last_end);
    }
    // A flipped bit in the last frame is a torn write too (its checksum fails).
    let mut flipped = data.clone();
    let n = flipped.len();
    flipped[n - 2] ^= 0x40;
    assert_eq!(decode_log(path, &flipped).unwrap().batches.len(), 4);
}

#[test]
fn a_frame_with_a_good_checksum_and_bad_records_is_corruption() {
    let payload = b"[{\"NoSuchRecord\":1}]";
    let mut data = (payload.len() as u32).to_le_bytes().to_vec();
    data.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    data.extend_from_slice(payload);
    assert!(matches!(
        decode_log(Path::new("x"), &data),
        Err(CheckpointError::Corrupt { .. })
    ));
}

#[test]
fn commits_survive_a_reopen_and_the_pending_batch_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, mut wal) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    assert!(ckpt.tasks.is_empty());
    let a = task(TaskState::Running);
    let b = task(TaskState::Staging);
    let agent = AgentId::random();
    wal.append(Record::AgentId(agent));
    wal.append(Record::Task(Box::new(a.clone())));
    wal.append(Record::Update(Box::new(update(&a, TaskState::Running))));
    wal.append(Record::GpuUnhealthy {
        uuid: "GPU-1".into(),
        reason: "xid 79".into(),
    });
    assert_eq!(wal.commit().unwrap(), 4);
    assert!(!wal.is_dirty());
    // Appended but never committed: the agent died before the fsync, nothing was sent.
    wal.append(Record::Task(Box::new(b.clone())));
    drop(wal);

    let (back, wal) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    assert_eq!(back.agent_id, Some(agent));
    assert_eq!(back.tasks.len(), 1);
    assert_eq!(back.tasks[&a.info.task_id].state, TaskState::Running);
    assert_eq!(back.updates.len(), 1);
    assert_eq!(back.unhealthy_gpus["GPU-1"], "xid 79");
    // Recovery wrote a fresh snapshot: one log is left, and it is empty.
    assert_eq!(log_gens(dir.path()).unwrap(), vec![wal.generation()]);
    assert_eq!(wal.size(), 0);
    assert_eq!(back.log_gen, wal.generation());
}

#[test]
fn a_written_batch_survives_the_agent_dying_before_a_sync() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut wal) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    let t = task(TaskState::Running);
    let u = update(&t, TaskState::Running);
    wal.append(Record::Task(Box::new(t.clone())));
    wal.append(Record::Update(Box::new(u.clone())));
    assert_eq!(wal.commit().unwrap(), 2);
    // The acknowledgement protects nothing sent: written, not synced; then the agent dies.
    wal.append(Record::Acked {
        task: t.info.task_id,
        update: u.update_id,
    });
    assert_eq!(wal.write().unwrap(), 1);
    assert!(!wal.is_dirty());
    drop(wal);
    let (back, _) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    assert_eq!(back.tasks.len(), 1);
    assert!(back.updates.is_empty(), "the written ack was replayed");
}

#[test]
fn a_whole_life_replays_to_nothing_and_a_torn_tail_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut wal) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    let t = task(TaskState::Staging);
    for b in life(&t) {
        for r in b {
            wal.append(r);
        }
        wal.commit().unwrap();
    }
    let gen = wal.generation();
    drop(wal);
    // Half a frame after the last commit.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(log_path(dir.path(), gen))
        .unwrap();
    f.write_all(&[200, 0, 0, 0, 1, 2]).unwrap();
    drop(f);
    let (back, _) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    assert!(back.tasks.is_empty() && back.updates.is_empty(), "{back:?}");
}

#[test]
fn compaction_keeps_everything_whenever_the_agent_dies() {
    let dir = tempfile::tempdir().unwrap();
    let (mut ckpt, mut wal) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    let a = task(TaskState::Running);
    let r = Record::Task(Box::new(a.clone()));
    r.clone().apply(&mut ckpt);
    wal.append(r);
    wal.commit().unwrap();
    // Rotate; the snapshot of the new generation is not written yet (the agent dies here):
    // the old log still holds the task.
    let gen = wal.rotate().unwrap();
    let b = task(TaskState::Running);
    let rb = Record::Task(Box::new(b.clone()));
    rb.clone().apply(&mut ckpt);
    wal.append(rb);
    wal.commit().unwrap();
    assert_eq!(log_gens(dir.path()).unwrap().len(), 2);
    {
        let copy = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(dir.path()).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), copy.path().join(e.file_name())).unwrap();
        }
        let (back, _) = Wal::open(copy.path(), Recovery::Refuse).unwrap();
        assert_eq!(back.tasks.len(), 2);
    }
    // The snapshot of the rotated generation (taken at rotation, without b) replaces the old
    // log; b is in the new log.
    let mut snap = ckpt.clone();
    snap.tasks.remove(&b.info.task_id);
    snap.log_gen = gen;
    write_snapshot(dir.path(), &snap).unwrap();
    assert_eq!(log_gens(dir.path()).unwrap(), vec![gen]);
    drop(wal);
    let (back, _) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    assert_eq!(back.tasks.len(), 2);
    assert!(back.tasks.contains_key(&a.info.task_id) && back.tasks.contains_key(&b.info.task_id));
}

#[test]
fn a_checkpoint_from_before_the_log_loads() {
    let dir = tempfile::tempdir().unwrap();
    let t = task(TaskState::Running);
    let json = serde_json::json!({
        "agent_id": null,
        "tasks": { t.info.task_id.to_string(): t },
        "updates": { "tasks": {} },
    });
    std::fs::write(dir.path().join(FILE), json.to_string()).unwrap();
    let (back, _) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    assert_eq!(back.tasks.len(), 1);
    assert!(back.log_gen > 0);
}

/// The frames of a task's life, encoded, with where each ends.
fn encoded_life(t: &TaskRecord) -> (Vec<Vec<Record>>, Vec<u8>, Vec<usize>) {
    let batches = life(t);
    let mut data = Vec::new();
    let mut ends = Vec::new();
    for b in &batches {
        encode_frame(b, &mut data);
        ends.push(data.len());
    }
    (batches, data, ends)
}

#[test]
fn a_corrupt_frame_with_frames_after_it_is_reported_not_taken_for_a_torn_tail() {
    let (batches, data, ends) = encoded_life(&task(TaskState::Staging));
    assert_eq!(batches.len(), 5);
    let path = Path::new("wal-test.log");
    // A flipped bit in the payload of the third frame: two valid frames follow it.
    let mut flipped = data.clone();
    flipped[ends[1] + HEADER + 3] ^= 0x10;
    let d = decode_log(path, &flipped).unwrap();
    assert_eq!(d.batches[..], batches[..2]);
    assert_eq!(d.torn_bytes, 0);
    assert_eq!(
        d.corrupt,
        Some(Corruption {
            offset: ends[1] as u64,
            dropped_bytes: (data.len() - ends[1]) as u64,
            frames_after: 2,
        })
    );
    // A flipped bit in its length (the frame now seems to run past the end of the log): the
    // valid frames after it still tell corruption from a torn write.
    let mut long = data.clone();
    long[ends[1] + 3] ^= 0x01;
    let d = decode_log(path, &long).unwrap();
    assert_eq!(d.batches.len(), 2);
    assert_eq!(
        d.corrupt.map(|c| (c.offset, c.frames_after)),
        Some((ends[1] as u64, 2))
    );
    // A torn last frame followed by zeros (a file extended by a crash) is still a torn write.
    let mut zeros = data[..ends[3] + 20].to_vec();
    zeros.extend_from_slice(&[0; 4096]);
    let d = decode_log(path, &zeros).unwrap();
    assert_eq!((d.batches.len(), d.corrupt), (4, None));
    assert_eq!(d.torn_bytes, 20 + 4096);
}

#[test]
fn the_agent_refuses_a_corrupt_log_unless_told_to_truncate_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_, wal) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    let gen = wal.generation();
    drop(wal);
    let t = task(TaskState::Staging);
    let (_, data, ends) = encoded_life(&t);
    // The log holds the task's first two batches (staged, running), then a corrupt one and
    // the rest; a later log holds one more task.
    let mut flipped = data.clone();
    flipped[ends[1] + HEADER + 3] ^= 0x10;
    std::fs::write(log_path(dir.path(), gen), &flipped).unwrap();
    let later = task(TaskState::Staging);
    let mut next = Vec::new();
    encode_frame(&[Record::Task(Box::new(later.clone()))], &mut next);
    std::fs::write(log_path(dir.path(), gen + 1), &next).unwrap();
    let err = Wal::open(dir.path(), Recovery::Refuse).unwrap_err();
    match &err {
        CheckpointError::MidLogCorruption {
            offset,
            frames_after,
            ..
        } => assert_eq!((*offset, *frames_after), (ends[1] as u64, 2)),
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("--recover-truncate"), "{err}");
    // Nothing was touched: refusing again gives the same answer.
    assert!(matches!(
        Wal::open(dir.path(), Recovery::Refuse),
        Err(CheckpointError::MidLogCorruption { .. })
    ));
    // Truncating: the state before the corrupt frame, without the later log.
    let (back, _) = Wal::open(dir.path(), Recovery::Truncate).unwrap();
    let rec = &back.tasks[&t.info.task_id];
    assert_eq!(rec.state, TaskState::Running);
    assert!(!back.tasks.contains_key(&later.info.task_id));
    assert_eq!(back.updates.len(), 1);
    // Its snapshot replaced the logs: the next start needs no flag.
    let (again, _) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    assert_eq!(again.tasks.len(), 1);
}

#[test]
fn stats_count_frames_and_syncs_across_rotations() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut wal) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    let a = task(TaskState::Running);
    // An acknowledgement-only batch is written, not synced; the next commit syncs both.
    wal.append(Record::Task(Box::new(a.clone())));
    wal.write().unwrap();
    assert_eq!(
        wal.stats(),
        WalStats {
            frames: 1,
            syncs: 0
        }
    );
    wal.append(Record::TaskRemoved(a.info.task_id));
    wal.commit().unwrap();
    assert_eq!(
        wal.stats(),
        WalStats {
            frames: 2,
            syncs: 1
        }
    );
    // Nothing pending and nothing unsynced: no sync.
    wal.commit().unwrap();
    wal.rotate().unwrap();
    assert_eq!(
        wal.stats(),
        WalStats {
            frames: 2,
            syncs: 1
        },
        "kept by a rotation"
    );
}

#[test]
fn a_sync_job_covers_what_was_written_before_it_and_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut wal) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    let a = task(TaskState::Running);
    wal.append(Record::Task(Box::new(a.clone())));
    wal.write().unwrap();
    let job = wal.sync_job().unwrap();
    // Written while the job runs: not covered by it.
    let b = task(TaskState::Running);
    wal.append(Record::Task(Box::new(b.clone())));
    wal.write().unwrap();
    let done = job.run().unwrap();
    wal.synced(done);
    assert_eq!(wal.stats().syncs, 1);
    // The second frame is still unsynced: a commit with nothing pending syncs it.
    wal.commit().unwrap();
    assert_eq!(wal.stats().syncs, 2);
    // Now everything is durable: nothing to sync.
    wal.commit().unwrap();
    assert_eq!(wal.stats().syncs, 2);

    // A job of the generation before a rotation: the rotation synced that log itself, and the
    // job's result does not mark the new log durable.
    wal.append(Record::TaskRemoved(a.info.task_id));
    wal.write().unwrap();
    let old = wal.sync_job().unwrap();
    wal.rotate().unwrap();
    assert_eq!(wal.stats().syncs, 3, "the rotation synced the old log");
    wal.append(Record::TaskRemoved(b.info.task_id));
    wal.write().unwrap();
    wal.synced(old.run().unwrap());
    wal.commit().unwrap();
    assert_eq!(
        wal.stats().syncs,
        5,
        "the new log's frame still needed its own sync"
    );
    // Both logs replay.
    drop(wal);
    let (back, _) = Wal::open(dir.path(), Recovery::Refuse).unwrap();
    assert!(back.tasks.is_empty());
}
