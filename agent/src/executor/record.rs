//! A task's launch record: one root-owned file, `META/launch.claim`, holds what the supervisor
//! and the agent know of a launch, one line per fact:
//!
//! ```text
//! supervisor PID START    the supervisor that claimed the launch (pid, start time in ticks)
//! base {...}              what a reused (pooled) cgroup's counters held when the task took it
//! task PGID               the task's process group, once started
//! exit {"code":0,...}     how the task ended
//! cgroup {...}            the agent's reading of the task's cgroup once it ended
//! ```
//!
//! **The claim.** Whoever creates the file first decides the launch's fate. The supervisor
//! writes its `supervisor` line (and the task cgroup's `base` line, when the agent handed one
//! over) into a temporary file and links it into place, which fails if the file exists: the
//! record appears with those lines in it, never empty. A restarted agent that finds a launch it
//! did not record creates the file empty: the launch was given up (reported FAILED) and a late
//! supervisor backs off, so a task never runs unseen.
//!
//! **The other lines** are appended (`O_APPEND`), each with one `write`, and count only once
//! their newline is there. Unknown lines are skipped.
//!
//! **One record of a task's facts.** The agent's write-ahead log ([`crate::wal`]) holds what the
//! agent *decided* about a task (its state, GPUs, ports, cgroup name, status updates); this
//! record holds what was *observed* of the launch, written by whoever observed it — the
//! supervisor, which outlives the agent, or the agent reading the task's cgroup. It is the only
//! source of those facts: a restarted agent reads the supervisor (pid and start time), the
//! task's process group, the exit, the baseline and the cgroup's outcome from here alone, and
//! the log never copies them (the running agent keeps the supervisor's answer to a launch in
//! memory; logs of agents before that held it, and are still read).
//!
//! One file where there were six (`supervisor.pid`, an empty `launch.claim`, `task.pid`,
//! `exit.json`, the agent's `cgroup-final.json` and `cgroup-base.json`, most of them written
//! through a temporary file and a rename): each new file is an inode to allocate and, once the
//! sandbox is collected, to free, which is most of what the task path costs on some file
//! systems (docs/benchmarks.md, "One real agent"). Agents before the record wrote those files;
//! [`read`] still reads them where the record has no line, so an upgraded agent recovers the
//! tasks of the old one.

use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::ExitStatus;

/// The record's name in a task's meta directory.
pub const RECORD_FILE: &str = "launch.claim";
/// The supervisor's record before it is linked into place.
const RECORD_TMP: &str = "launch.claim.tmp";

/// The files of agents before the record: read, never written.
const LEGACY_SUPERVISOR: &str = "supervisor.pid";
const LEGACY_TASK: &str = "task.pid";
const LEGACY_EXIT: &str = "exit.json";
const LEGACY_CGROUP: &str = "cgroup-final.json";
/// The baseline's own file (agents before it moved into the claim).
const LEGACY_BASE: &str = "cgroup-base.json";

/// What a record says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    /// The supervisor that claimed the launch: its pid and start time (`None`: the agent
    /// claimed it, and it never runs).
    pub supervisor: Option<(i32, u64)>,
    /// The counters the task's (reused, pooled) cgroup held when the task took it (JSON,
    /// [`crate::isolation::Baseline`]); `None` when they were all zero.
    pub base: Option<String>,
    /// The task's process group, once started.
    pub task_pgid: Option<i32>,
    /// How the task ended.
    pub exit: Option<ExitStatus>,
    /// The agent's reading of the task's cgroup once it ended (JSON).
    pub cgroup: Option<String>,
}

impl Record {
    /// Reads a record's text: whole lines only (a line being appended counts once its newline
    /// is written); the last line of a kind wins; unknown lines are skipped.
    pub fn parse(text: &str) -> Record {
        let mut r = Record::default();
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        for line in whole.lines() {
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            match key {
                "supervisor" => r.supervisor = parse_supervisor(value),
                "base" => r.base = Some(value.to_string()),
                "task" => r.task_pgid = parse_pgid(value),
                "exit" => r.exit = serde_json::from_str(value).ok(),
                "cgroup" => r.cgroup = Some(value.to_string()),
                _ => {}
            }
        }
        r
    }
}

fn parse_supervisor(value: &str) -> Option<(i32, u64)> {
    let (pid, start) = value.trim().split_once(' ')?;
    let pid: i32 = pid.parse().ok().filter(|&p| p > 1)?;
    Some((pid, start.parse().ok()?))
}

fn parse_pgid(value: &str) -> Option<i32> {
    value.trim().parse().ok().filter(|&p| p > 1)
}

/// The record of the launch in `meta` (`None`: nobody claimed it), with what an older agent's
/// separate files say where it has no line.
pub fn read(meta: &Path) -> Option<Record> {
    let text = std::fs::read_to_string(meta.join(RECORD_FILE)).ok()?;
    let mut r = Record::parse(&text);
    // Each fact the record lacks, from an older agent's file if there is one (an older
    // supervisor claimed with an empty record, its pid file written just before; a newer agent
    // may since have appended its `cgroup` line).
    let legacy = |name: &str| std::fs::read_to_string(meta.join(name)).ok();
    if r.supervisor.is_none() {
        r.supervisor = legacy(LEGACY_SUPERVISOR).and_then(|t| parse_supervisor(&t));
    }
    if r.task_pgid.is_none() {
        r.task_pgid = legacy(LEGACY_TASK).and_then(|t| parse_pgid(&t));
    }
    if r.exit.is_none() {
        r.exit = legacy(LEGACY_EXIT).and_then(|t| serde_json::from_str(&t).ok());
    }
    if r.cgroup.is_none() {
        r.cgroup = legacy(LEGACY_CGROUP);
    }
    if r.base.is_none() {
        r.base = legacy(LEGACY_BASE);
    }
    Some(r)
}

/// When the record last changed (its last line: usually the task's end), Unix milliseconds.
pub fn changed_ms(meta: &Path) -> Option<u64> {
    let mtime = |name: &str| {
        let t = std::fs::metadata(meta.join(name)).ok()?.modified().ok()?;
        Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64)
    };
    mtime(LEGACY_EXIT).or_else(|| mtime(RECORD_FILE))
}

/// The restarted agent's claim: creates the record empty. True when it did (no supervisor
/// had claimed the launch, and none will run it now).
pub fn claim_for_agent(meta: &Path) -> bool {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(meta.join(RECORD_FILE))
        .is_ok()
}

/// The supervisor's claim, with its `supervisor` line (`me`: `PID START`) and, when the agent
/// handed one over, the `base` line of the task's cgroup (JSON, one line): true when it
/// claimed the launch, false when a restarted agent had given it up.
pub fn claim_for_supervisor(meta: &Path, me: &str, base: Option<&str>) -> std::io::Result<bool> {
    let mut text = format!("supervisor {me}\n");
    if let Some(base) = base {
        if base.contains('\n') {
            return Err(std::io::Error::new(
                ErrorKind::InvalidInput,
                "a record line must not contain a newline",
            ));
        }
        text.push_str(&format!("base {base}\n"));
    }
    let tmp = meta.join(RECORD_TMP);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()));
    // A hard link fails if the record exists, and allocates no inode: the record *is* the
    // written file, under its final name.
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, meta.join(RECORD_FILE)));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// Appends one line (`KEY VALUE`, no newline in it) to the record in `meta`. `create`: also
/// when there is no record yet (the agent's `cgroup` line of a launch no supervisor claimed).
pub fn append(meta: &Path, key: &str, value: &str, create: bool) -> std::io::Result<()> {
    let line = format!("{key} {value}\n");
    if line[..line.len() - 1].contains('\n') {
        return Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            "a record line must not contain a newline",
        ));
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(create)
        .mode(0o600)
        .open(meta.join(RECORD_FILE))?
        .write_all(line.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_lines_count_the_last_of_a_kind_wins_and_unknown_lines_are_skipped() {
        let r = Record::parse(
            "supervisor 77 123\ntask 4242\nnewer-agent says hi\nexit {\"code\":3,\"signal\":null}\ncgroup {\"a\":1}\nexit {\"code\":4,\"sig",
        );
        assert_eq!(r.supervisor, Some((77, 123)));
        assert_eq!(r.task_pgid, Some(4242));
        assert_eq!(
            r.exit,
            Some(ExitStatus {
                code: Some(3),
                signal: None
            }),
            "the half-written exit line does not count"
        );
        assert_eq!(r.cgroup.as_deref(), Some("{\"a\":1}"));
        assert_eq!(Record::parse("supervisor 77 12"), Record::default());
        // Pids 0 and 1 are never a supervisor's or a task's (kill(-1) signals everything).
        assert_eq!(Record::parse("supervisor 1 5\ntask 1\n"), Record::default());
    }

    #[test]
    fn the_first_claim_wins_and_the_record_appears_with_its_supervisor_line() {
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path();
        assert_eq!(read(meta), None);
        assert!(claim_for_supervisor(meta, "77 123", None).unwrap());
        assert!(!claim_for_supervisor(meta, "78 124", None).unwrap());
        assert!(!claim_for_agent(meta));
        append(meta, "task", "4242", false).unwrap();
        let r = read(meta).unwrap();
        assert_eq!((r.supervisor, r.task_pgid), (Some((77, 123)), Some(4242)));
        assert!(!meta.join(RECORD_TMP).exists());

        let given_up = dir.path().join("given-up");
        std::fs::create_dir(&given_up).unwrap();
        assert!(claim_for_agent(&given_up));
        assert!(!claim_for_supervisor(&given_up, "77 123", None).unwrap());
        assert_eq!(read(&given_up), Some(Record::default()));
        assert!(append(&given_up, "exit", "{\n}", false).is_err());
        // The supervisor appends only to its own claim.
        let unclaimed = dir.path().join("unclaimed");
        std::fs::create_dir(&unclaimed).unwrap();
        assert!(append(&unclaimed, "task", "4242", false).is_err());
        assert!(!unclaimed.join(RECORD_FILE).exists());
    }

    #[test]
    fn the_baseline_is_written_with_the_claim() {
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path();
        let base = r#"{"oom_kills":2,"cpu_usec":1500}"#;
        assert!(claim_for_supervisor(meta, "77 123", Some(base)).unwrap());
        assert_eq!(
            std::fs::read_to_string(meta.join(RECORD_FILE)).unwrap(),
            format!("supervisor 77 123\nbase {base}\n"),
            "the record appears with both lines"
        );
        append(meta, "exit", r#"{"code":0,"signal":null}"#, false).unwrap();
        let r = read(meta).unwrap();
        assert_eq!(r.supervisor, Some((77, 123)));
        assert_eq!(r.base.as_deref(), Some(base));
        assert_eq!(r.exit.and_then(|e| e.code), Some(0));
        // A base line the record would misread is refused, and nothing is claimed.
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        assert!(claim_for_supervisor(&other, "77 123", Some("{\n}")).is_err());
        assert_eq!(read(&other), None);
    }

    #[test]
    fn an_older_agents_files_are_read_where_the_record_has_no_line() {
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path();
        std::fs::write(meta.join(LEGACY_SUPERVISOR), "77 123").unwrap();
        std::fs::write(meta.join(RECORD_FILE), "").unwrap();
        std::fs::write(meta.join(LEGACY_TASK), "4242").unwrap();
        std::fs::write(meta.join(LEGACY_EXIT), "{\"code\":0,\"signal\":null}").unwrap();
        let r = read(meta).unwrap();
        assert_eq!(r.supervisor, Some((77, 123)));
        assert_eq!(r.task_pgid, Some(4242));
        assert_eq!(r.exit.and_then(|e| e.code), Some(0));
        // The baseline an agent before the record's `base` line wrote on its own.
        assert_eq!(read(meta).unwrap().base, None);
        std::fs::write(meta.join(LEGACY_BASE), "{\"oom_kills\":1,\"cpu_usec\":0}").unwrap();
        assert_eq!(
            read(meta).unwrap().base.as_deref(),
            Some("{\"oom_kills\":1,\"cpu_usec\":0}")
        );
        // Without the old supervisor's pid file, an empty record is the agent's claim.
        std::fs::remove_file(meta.join(LEGACY_SUPERVISOR)).unwrap();
        assert_eq!(read(meta).unwrap().supervisor, None);
    }
}
