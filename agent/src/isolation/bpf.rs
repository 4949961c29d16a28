//! The cgroup v2 device filter: [`DeviceRule`]s compiled to a `BPF_PROG_TYPE_CGROUP_DEVICE`
//! program (raw eBPF instructions), loaded with `bpf(BPF_PROG_LOAD)` and attached to a cgroup
//! directory with `bpf(BPF_PROG_ATTACH, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI)`.
//!
//! The program reads `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major; u32 minor; }`
//! (`access_type` = access bits << 16 | device type) and returns 1 (allow) when any rule
//! matches, 0 (deny) otherwise. [`evaluate`] interprets the generated instructions, so tests
//! check the program's actual decisions without a kernel.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use super::devices::{access, DeviceRule, DeviceType};

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Insn {
    pub code: u8,
    /// dst_reg (low 4 bits) | src_reg << 4.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

const BPF_LDX_MEM_W: u8 = 0x61;
const BPF_ALU32_AND_K: u8 = 0x54;
const BPF_ALU32_RSH_K: u8 = 0x74;
const BPF_ALU32_MOV_X: u8 = 0xbc;
const BPF_ALU64_MOV_K: u8 = 0xb7;
const BPF_JMP_JNE_K: u8 = 0x55;
const BPF_JMP_EXIT: u8 = 0x95;

/// `BPF_DEVCG_DEV_BLOCK`.
pub const DEV_BLOCK: u32 = 1;
/// `BPF_DEVCG_DEV_CHAR`.
pub const DEV_CHAR: u32 = 2;

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (dst & 0xf) | (src << 4),
        off,
        imm,
    }
}

/// Compiles allow rules into a device-filter program (default deny).
pub fn compile(rules: &[DeviceRule]) -> Vec<Insn> {
    // r2 = type, r3 = access, r4 = major, r5 = minor
    let mut p = vec![
        insn(BPF_LDX_MEM_W, 2, 1, 0, 0),
        insn(BPF_ALU32_AND_K, 2, 0, 0, 0xffff),
        insn(BPF_LDX_MEM_W, 3, 1, 0, 0),
        insn(BPF_ALU32_RSH_K, 3, 0, 0, 16),
        insn(BPF_LDX_MEM_W, 4, 1, 4, 0),
        insn(BPF_LDX_MEM_W, 5, 1, 8, 0),
    ];
    for r in rules {
        let mut block = Vec::new();
        // Each check is (instructions before the jump, jump-if-not-equal register, imm).
        match r.kind {
            DeviceType::Char => block.push((vec![], 2, DEV_CHAR as i32)),
            DeviceType::Block => block.push((vec![], 2, DEV_BLOCK as i32)),
            DeviceType::All => {}
        }
        if r.access & access::ALL != access::ALL {
            // r6 = access & ~allowed; must be 0
            let denied = i32::from(access::ALL & !r.access);
            block.push((
                vec![
                    insn(BPF_ALU32_MOV_X, 6, 3, 0, 0),
                    insn(BPF_ALU32_AND_K, 6, 0, 0, denied),
                ],
                6,
                0,
            ));
        }
        if let Some(m) = r.major {
            block.push((vec![], 4, m as i32));
        }
        if let Some(m) = r.minor {
            block.push((vec![], 5, m as i32));
        }
        let total: usize = block.iter().map(|(pre, _, _)| pre.len() + 1).sum::<usize>() + 2;
        let mut emitted = 0;
        for (pre, reg, imm) in block {
            emitted += pre.len() + 1;
            p.extend(pre);
            // Jump past the rest of this block (to the next rule) when it does not match.
            p.push(insn(BPF_JMP_JNE_K, reg, 0, (total - emitted) as i16, imm));
        }
        p.push(insn(BPF_ALU64_MOV_K, 0, 0, 0, 1));
        p.push(insn(BPF_JMP_EXIT, 0, 0, 0, 0));
    }
    p.push(insn(BPF_ALU64_MOV_K, 0, 0, 0, 0));
    p.push(insn(BPF_JMP_EXIT, 0, 0, 0, 0));
    p
}

/// Why the evaluator rejected a program.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    #[error("instruction {0}: unsupported opcode {1:#x}")]
    Opcode(usize, u8),
    #[error("jump out of the program at instruction {0}")]
    Bounds(usize),
    #[error("load outside the context at instruction {0}")]
    Load(usize),
    #[error("program did not exit")]
    NoExit,
}

/// Runs a device-filter program on a request: device `kind` (Char or Block), `major:minor`,
/// `acc` (access bits). Returns the program's result (1 allow, 0 deny).
pub fn evaluate(
    prog: &[Insn],
    kind: DeviceType,
    major: u32,
    minor: u32,
    acc: u8,
) -> Result<u64, EvalError> {
    let dev = match kind {
        DeviceType::Block => DEV_BLOCK,
        _ => DEV_CHAR,
    };
    let ctx = [(u32::from(acc) << 16) | dev, major, minor];
    let mut r = [0u64; 11];
    let mut pc = 0usize;
    for _ in 0..100_000 {
        let i = prog.get(pc).ok_or(EvalError::Bounds(pc))?;
        let (dst, src) = ((i.regs & 0xf) as usize, (i.regs >> 4) as usize);
        if dst > 10 || src > 10 {
            return Err(EvalError::Opcode(pc, i.code));
        }
        let mut next = pc + 1;
        match i.code {
            BPF_LDX_MEM_W => {
                if src != 1 || i.off < 0 || i.off % 4 != 0 {
                    return Err(EvalError::Load(pc));
                }
                r[dst] = u64::from(*ctx.get(i.off as usize / 4).ok_or(EvalError::Load(pc))?);
            }
            BPF_ALU32_AND_K => r[dst] = u64::from((r[dst] as u32) & (i.imm as u32)),
            BPF_ALU32_RSH_K => r[dst] = u64::from((r[dst] as u32) >> (i.imm as u32 & 31)),
            BPF_ALU32_MOV_X => r[dst] = u64::from(r[src] as u32),
            BPF_ALU64_MOV_K => r[dst] = i.imm as i64 as u64,
            BPF_JMP_JNE_K => {
                if r[dst] != i.imm as i64 as u64 {
                    let t = pc as i64 + 1 + i64::from(i.off);
                    next = usize::try_from(t).map_err(|_| EvalError::Bounds(pc))?;
                }
            }
            BPF_JMP_EXIT => return Ok(r[0]),
            other => return Err(EvalError::Opcode(pc, other)),
        }
        pc = next;
    }
    Err(EvalError::NoExit)
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;

#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

/// Why the device filter could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("bpf(BPF_PROG_LOAD) failed: {source}{}", if log.is_empty() { String::new() } else { format!("; verifier: {log}") })]
    Load { source: io::Error, log: String },
    #[error("cannot open cgroup {path}: {source}")]
    Open { path: String, source: io::Error },
    #[error("bpf(BPF_PROG_ATTACH/DETACH) on {path} failed: {source}")]
    Attach { path: String, source: io::Error },
}

fn load(prog: &[Insn], log: &mut [u8]) -> io::Result<OwnedFd> {
    let license = c"Apache-2.0";
    let mut name = [0u8; 16];
    name[..13].copy_from_slice(b"gantry_device");
    let attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: prog.len() as u32,
        insns: prog.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: u32::from(!log.is_empty()),
        log_size: log.len() as u32,
        log_buf: if log.is_empty() {
            0
        } else {
            log.as_mut_ptr() as u64
        },
        kern_version: 0,
        prog_flags: 0,
        prog_name: name,
        prog_ifindex: 0,
        expected_attach_type: 0,
    };
    // SAFETY: `attr` is a valid bpf_attr prefix; the pointers it holds outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &attr as *const ProgLoadAttr,
            std::mem::size_of::<ProgLoadAttr>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new file descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Loads `prog` into the kernel; the verifier's log is in the error.
pub fn load_program(prog: &[Insn]) -> Result<OwnedFd, BpfError> {
    match load(prog, &mut []) {
        Ok(fd) => Ok(fd),
        Err(source) => {
            let mut buf = vec![0u8; 64 * 1024];
            let log = match load(prog, &mut buf) {
                Ok(fd) => return Ok(fd),
                Err(_) => {
                    String::from_utf8_lossy(&buf[..buf.iter().position(|b| *b == 0).unwrap_or(0)])
                        .into_owned()
                }
            };
            Err(BpfError::Load { source, log })
        }
    }
}

/// Distinct programs kept loaded (one per distinct device rule set: CPU tasks share one, GPU
/// tasks one per GPU combination in use); past this the cache starts over.
const PROGRAM_CACHE: usize = 256;

/// A loaded program for `prog`: loaded (and verified) once, then the same program is attached
/// to every cgroup that needs it, instead of one `BPF_PROG_LOAD` per task.
fn cached_program(prog: Vec<Insn>) -> Result<Arc<OwnedFd>, BpfError> {
    static CACHE: OnceLock<Mutex<HashMap<Vec<Insn>, Arc<OwnedFd>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let lock = || {
        cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    if let Some(fd) = lock().get(&prog) {
        return Ok(fd.clone());
    }
    let fd = Arc::new(load_program(&prog)?);
    let mut map = lock();
    if map.len() >= PROGRAM_CACHE {
        map.clear();
    }
    Ok(map.entry(prog).or_insert(fd).clone())
}

/// Compiles `rules`, loads the program (once per distinct program) and attaches it to the
/// cgroup directory `cgroup`. The attachment lives as long as the cgroup.
pub fn install(cgroup: &Path, rules: &[DeviceRule]) -> Result<(), BpfError> {
    prog_op(cgroup, rules, BPF_PROG_ATTACH)
}

/// Detaches the program [`install`] attached for the same `rules` (a pooled cgroup is
/// returned to the pool without its last task's filter). The program comes from the same
/// cache, so its descriptor names the attached program.
pub fn detach(cgroup: &Path, rules: &[DeviceRule]) -> Result<(), BpfError> {
    prog_op(cgroup, rules, BPF_PROG_DETACH)
}

fn prog_op(cgroup: &Path, rules: &[DeviceRule], cmd: libc::c_long) -> Result<(), BpfError> {
    let prog_fd = cached_program(compile(rules))?;
    let path = cgroup.display().to_string();
    let c = CString::new(cgroup.as_os_str().as_bytes()).map_err(|_| BpfError::Open {
        path: path.clone(),
        source: io::ErrorKind::InvalidInput.into(),
    })?;
    // SAFETY: valid C string; the result is checked.
    let dir = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dir < 0 {
        return Err(BpfError::Open {
            path,
            source: io::Error::last_os_error(),
        });
    }
    // SAFETY: `dir` is a new descriptor we own.
    let dir = unsafe { OwnedFd::from_raw_fd(dir) };
    let attr = ProgAttachAttr {
        target_fd: dir.as_raw_fd() as u32,
        attach_bpf_fd: prog_fd.as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: if cmd == BPF_PROG_ATTACH {
            BPF_F_ALLOW_MULTI
        } else {
            0
        },
        replace_bpf_fd: 0,
    };
    // SAFETY: `attr` is a valid bpf_attr prefix for BPF_PROG_ATTACH / BPF_PROG_DETACH.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            &attr as *const ProgAttachAttr,
            std::mem::size_of::<ProgAttachAttr>(),
        )
    };
    if rc < 0 {
        return Err(BpfError::Attach {
            path,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolation::devices::NvidiaMajors;
    use proptest::prelude::*;

    const RW: u8 = access::READ | access::WRITE;

    #[test]
    fn one_program_is_loaded_per_rule_set() {
        let majors = NvidiaMajors {
            nvidia: 195,
            uvm: Some(508),
        };
        let cpu = compile(&DeviceRule::for_task(&[], &majors));
        let Ok(a) = cached_program(cpu.clone()) else {
            eprintln!("skipped: loading eBPF programs needs CAP_BPF (root)");
            return;
        };
        let b = cached_program(cpu).unwrap();
        assert!(
            Arc::ptr_eq(&a, &b),
            "the same rules reuse the loaded program"
        );
        let gpu = cached_program(compile(&DeviceRule::for_task(&[1], &majors))).unwrap();
        assert!(!Arc::ptr_eq(&a, &gpu));
    }

    #[test]
    fn gpu_task_program_decisions() {
        let majors = NvidiaMajors {
            nvidia: 195,
            uvm: Some(508),
        };
        let prog = compile(&DeviceRule::for_task(&[0, 2], &majors));
        let ev = |k, maj, min, acc| evaluate(&prog, k, maj, min, acc).unwrap();
        use DeviceType::{Block, Char};
        assert_eq!(ev(Char, 195, 0, RW), 1);
        assert_eq!(ev(Char, 195, 2, RW), 1);
        assert_eq!(ev(Char, 195, 1, RW), 0, "another task's GPU");
        assert_eq!(ev(Char, 195, 3, access::READ), 0);
        assert_eq!(ev(Char, 195, 255, RW), 1, "nvidiactl");
        assert_eq!(ev(Char, 195, 254, RW), 1, "nvidia-modeset");
        assert_eq!(ev(Char, 508, 0, RW), 1, "nvidia-uvm");
        assert_eq!(ev(Char, 508, 1, RW), 1, "nvidia-uvm-tools");
        assert_eq!(ev(Char, 1, 3, RW), 1, "/dev/null");
        assert_eq!(ev(Char, 136, 4, RW), 1, "/dev/pts/4");
        assert_eq!(ev(Char, 1, 1, access::READ), 0, "/dev/mem");
        assert_eq!(ev(Block, 8, 0, access::READ), 0, "/dev/sda");
        assert_eq!(ev(Block, 8, 0, access::MKNOD), 1, "mknod only");
        assert_eq!(ev(Char, 195, 1, access::MKNOD), 1);
        assert_eq!(ev(Char, 195, 1, access::MKNOD | access::READ), 0);
    }

    #[test]
    fn empty_rules_deny_everything() {
        let prog = compile(&[]);
        assert_eq!(evaluate(&prog, DeviceType::Char, 1, 3, access::READ), Ok(0));
    }

    #[test]
    fn evaluator_rejects_unknown_code() {
        let prog = vec![insn(0x18, 0, 0, 0, 0)];
        assert!(matches!(
            evaluate(&prog, DeviceType::Char, 1, 3, 2),
            Err(EvalError::Opcode(0, 0x18))
        ));
        let prog = vec![insn(BPF_JMP_JNE_K, 0, 0, 5, 1)];
        assert!(evaluate(&prog, DeviceType::Char, 1, 3, 2).is_err());
    }

    fn arb_rule() -> impl Strategy<Value = DeviceRule> {
        (
            0u8..3,
            prop::option::of(0u32..4),
            prop::option::of(0u32..4),
            1u8..8,
        )
            .prop_map(|(k, major, minor, access)| DeviceRule {
                kind: [DeviceType::Char, DeviceType::Block, DeviceType::All][k as usize],
                major,
                minor,
                access,
            })
    }

    proptest! {
        /// The compiled program decides exactly like the rules themselves.
        #[test]
        fn program_matches_rule_semantics(
            rules in prop::collection::vec(arb_rule(), 0..8),
            block in any::<bool>(), major in 0u32..5, minor in 0u32..5, acc in 1u8..8,
        ) {
            let kind = if block { DeviceType::Block } else { DeviceType::Char };
            let prog = compile(&rules);
            let want = rules.iter().any(|r| r.allows(kind, major, minor, acc));
            prop_assert_eq!(evaluate(&prog, kind, major, minor, acc), Ok(u64::from(want)));
        }
    }
}
