//! Device access rules for task cgroups: what every task may open (`/dev/null`, ttys, ...)
//! plus its own GPUs (`/dev/nvidiaN`) and the NVIDIA control nodes every CUDA program needs.
//! Rendered as cgroup v1 `devices.allow` lines or compiled to an eBPF program for v2
//! ([`super::bpf`]). Everything not allowed is denied.

use std::fmt;

/// Kind of device a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceType {
    Char,
    Block,
    /// Both (v1 `a`).
    All,
}

/// Access bits, numerically as in `BPF_DEVCG_ACC_*`.
pub mod access {
    /// Create the node (`m`).
    pub const MKNOD: u8 = 1;
    /// Read (`r`).
    pub const READ: u8 = 2;
    /// Write (`w`).
    pub const WRITE: u8 = 4;
    /// `rwm`.
    pub const ALL: u8 = MKNOD | READ | WRITE;
}

/// One allow rule; `None` numbers are wildcards (`*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceRule {
    pub kind: DeviceType,
    pub major: Option<u32>,
    pub minor: Option<u32>,
    /// A combination of [`access`] bits.
    pub access: u8,
}

impl DeviceRule {
    /// A character device rule with full access.
    pub const fn char_rwm(major: u32, minor: u32) -> Self {
        Self {
            kind: DeviceType::Char,
            major: Some(major),
            minor: Some(minor),
            access: access::ALL,
        }
    }

    /// Whether this rule allows `access` (bits) on a device of `kind` `major:minor`.
    pub fn allows(&self, kind: DeviceType, major: u32, minor: u32, acc: u8) -> bool {
        (self.kind == DeviceType::All || self.kind == kind)
            && matches_number(self.major, major)
            && matches_number(self.minor, minor)
            && acc & !self.access == 0
    }

    /// The rules every task gets: `mknod` of any node (creating a node grants no access to it),
    /// `/dev/null`, `zero`, `full`, `random`, `urandom`, `tty`, `console`, `ptmx` and `/dev/pts/*`.
    pub fn standard() -> Vec<DeviceRule> {
        let mut v = vec![
            DeviceRule {
                kind: DeviceType::Char,
                major: None,
                minor: None,
                access: access::MKNOD,
            },
            DeviceRule {
                kind: DeviceType::Block,
                major: None,
                minor: None,
                access: access::MKNOD,
            },
        ];
        for (major, minor) in [
            (1, 3),
            (1, 5),
            (1, 7),
            (1, 8),
            (1, 9),
            (5, 0),
            (5, 1),
            (5, 2),
        ] {
            v.push(DeviceRule::char_rwm(major, minor));
        }
        v.push(DeviceRule {
            kind: DeviceType::Char,
            major: Some(136),
            minor: None,
            access: access::ALL,
        });
        v
    }

    /// The standard rules plus the given GPUs (`/dev/nvidia<minor>`) and the NVIDIA control
    /// nodes (`nvidiactl`, `nvidia-modeset`, `nvidia-uvm`, `nvidia-uvm-tools`). A task without
    /// GPUs gets no NVIDIA node at all.
    pub fn for_task(gpu_minors: &[u32], majors: &NvidiaMajors) -> Vec<DeviceRule> {
        let mut v = Self::standard();
        if gpu_minors.is_empty() {
            return v;
        }
        for &m in gpu_minors {
            v.push(DeviceRule::char_rwm(majors.nvidia, m));
        }
        v.push(DeviceRule::char_rwm(majors.nvidia, NVIDIACTL_MINOR));
        v.push(DeviceRule::char_rwm(majors.nvidia, NVIDIA_MODESET_MINOR));
        if let Some(uvm) = majors.uvm {
            v.push(DeviceRule::char_rwm(uvm, 0));
            v.push(DeviceRule::char_rwm(uvm, 1));
        }
        v
    }

    /// The cgroup v1 `devices.allow` line.
    pub fn v1_line(&self) -> String {
        self.to_string()
    }
}

fn matches_number(rule: Option<u32>, n: u32) -> bool {
    match rule {
        None => true,
        Some(m) => m == n,
    }
}

impl fmt::Display for DeviceRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = match self.kind {
            DeviceType::Char => 'c',
            DeviceType::Block => 'b',
            DeviceType::All => 'a',
        };
        let num = |n: Option<u32>| n.map_or("*".to_string(), |n| n.to_string());
        let mut acc = String::new();
        for (bit, c) in [
            (access::READ, 'r'),
            (access::WRITE, 'w'),
            (access::MKNOD, 'm'),
        ] {
            if self.access & bit != 0 {
                acc.push(c);
            }
        }
        write!(f, "{t} {}:{} {acc}", num(self.major), num(self.minor))
    }
}

/// `nvidiactl`'s minor under the NVIDIA major.
pub const NVIDIACTL_MINOR: u32 = 255;
/// `nvidia-modeset`'s minor under the NVIDIA major.
pub const NVIDIA_MODESET_MINOR: u32 = 254;

/// Character-device majors of the NVIDIA driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvidiaMajors {
    /// `/dev/nvidiaN`, `nvidiactl`, `nvidia-modeset` (195).
    pub nvidia: u32,
    /// `nvidia-uvm` (minor 0) and `nvidia-uvm-tools` (minor 1); dynamic, `None` when the
    /// module is not loaded.
    pub uvm: Option<u32>,
}

impl Default for NvidiaMajors {
    fn default() -> Self {
        Self {
            nvidia: 195,
            uvm: None,
        }
    }
}

impl NvidiaMajors {
    /// Reads `/proc/devices`.
    pub fn detect() -> Self {
        std::fs::read_to_string("/proc/devices")
            .map(|t| Self::parse(&t))
            .unwrap_or_default()
    }

    /// Parses the character-device section of a `/proc/devices` text.
    pub fn parse(text: &str) -> Self {
        let mut out = Self::default();
        for line in text.lines() {
            if line.starts_with("Block devices") {
                break;
            }
            let mut it = line.split_whitespace();
            let (Some(num), Some(name)) = (it.next(), it.next()) else {
                continue;
            };
            let Ok(num) = num.parse::<u32>() else {
                continue;
            };
            match name {
                "nvidia-frontend" | "nvidia" => out.nvidia = num,
                "nvidia-uvm" => out.uvm = Some(num),
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_lines() {
        assert_eq!(DeviceRule::char_rwm(195, 0).v1_line(), "c 195:0 rwm");
        let r = DeviceRule {
            kind: DeviceType::Block,
            major: None,
            minor: None,
            access: access::MKNOD,
        };
        assert_eq!(r.v1_line(), "b *:* m");
        let r = DeviceRule {
            kind: DeviceType::All,
            major: Some(1),
            minor: None,
            access: access::READ | access::WRITE,
        };
        assert_eq!(r.v1_line(), "a 1:* rw");
    }

    #[test]
    fn task_rules_cover_gpus_and_control_nodes() {
        let majors = NvidiaMajors::parse("Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-uvm\n\nBlock devices:\n  8 sd\n");
        assert_eq!(
            majors,
            NvidiaMajors {
                nvidia: 195,
                uvm: Some(508)
            }
        );
        let rules = DeviceRule::for_task(&[1, 3], &majors);
        let ok = |maj, min| {
            rules
                .iter()
                .any(|r| r.allows(DeviceType::Char, maj, min, access::READ | access::WRITE))
        };
        assert!(
            ok(195, 1) && ok(195, 3) && ok(195, 255) && ok(195, 254) && ok(508, 0) && ok(508, 1)
        );
        assert!(!ok(195, 0) && !ok(195, 2) && !ok(8, 0));
        assert!(ok(1, 3) && ok(136, 7));
        // mknod of anything, but no access to it.
        assert!(rules
            .iter()
            .any(|r| r.allows(DeviceType::Block, 8, 0, access::MKNOD)));
        assert!(!rules
            .iter()
            .any(|r| r.allows(DeviceType::Block, 8, 0, access::READ)));
        assert!(!DeviceRule::for_task(&[], &majors)
            .iter()
            .any(|r| r.major == Some(195)));
    }
}
