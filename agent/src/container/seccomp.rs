//! The default seccomp profile of container tasks: everything is allowed except the system
//! calls below, which fail with `EPERM`. They are the ones Docker's default profile refuses
//! to unprivileged containers, kept as a deny-list (short, reviewable) rather than Docker's
//! allow-list: kernel modules and kexec, reboot, swap, clock and time changes, the kernel
//! keyring, BPF and perf events, `ptrace` of other processes, namespace changes (`unshare`,
//! `setns`), mounts, `pivot_root`, `open_by_handle_at` (a known container escape),
//! `userfaultfd`, accounting, quotas, raw I/O ports and obsolete calls. Most of them also need
//! capabilities the task does not have (runc's default set); the profile is a second wall.

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompBuilder, LinuxSyscallBuilder,
};

/// The system calls refused.
pub const DENIED: &[&str] = &[
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "init_module",
    "ioperm",
    "iopl",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "mount_setattr",
    "move_mount",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "ptrace",
    "query_module",
    "quotactl",
    "reboot",
    "request_key",
    "setns",
    "settimeofday",
    "stime",
    "swapoff",
    "swapon",
    "syslog",
    "umount",
    "umount2",
    "unshare",
    "uselib",
    "userfaultfd",
    "ustat",
    "vm86",
    "vm86old",
];

/// The profile: allow by default, `EPERM` for [`DENIED`].
pub fn default_profile() -> Result<LinuxSeccomp, oci_spec::OciSpecError> {
    let deny = LinuxSyscallBuilder::default()
        .names(DENIED.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .action(LinuxSeccompAction::ScmpActErrno)
        .errno_ret(libc::EPERM as u32)
        .build()?;
    LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
        .architectures(vec![
            Arch::ScmpArchX86_64,
            Arch::ScmpArchX86,
            Arch::ScmpArchX32,
            Arch::ScmpArchAarch64,
        ])
        .syscalls(vec![deny])
        .build()
}
