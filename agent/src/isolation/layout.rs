//! Where the cgroup hierarchies are mounted, from `/proc/self/mountinfo`: cgroup v1 (one
//! hierarchy per controller or per group of co-mounted controllers) or the v2 unified
//! hierarchy. On a hybrid host (v1 controllers plus a v2 mount without them) v1 is used.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The v1 controllers task cgroups use.
pub const V1_CONTROLLERS: [&str; 6] = ["cpu", "cpuacct", "memory", "pids", "devices", "freezer"];

/// Mounted cgroup hierarchies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupLayout {
    /// Controller name -> mount point of its hierarchy.
    V1 { mounts: BTreeMap<String, PathBuf> },
    /// The unified hierarchy's mount point.
    V2 { mount: PathBuf },
}

impl CgroupLayout {
    /// Reads this process's mount table; `None` when no usable cgroup mount exists.
    pub fn detect() -> Option<CgroupLayout> {
        Self::from_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").ok()?)
    }

    /// Parses a mountinfo text. v1 wins when the memory controller is mounted as v1; otherwise
    /// a v2 mount (`/sys/fs/cgroup` preferred).
    pub fn from_mountinfo(text: &str) -> Option<CgroupLayout> {
        let mut v1 = BTreeMap::new();
        let mut v2: Vec<PathBuf> = Vec::new();
        for line in text.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            if pre.len() < 5 || post.len() < 3 {
                continue;
            }
            let mount = PathBuf::from(unescape(pre[4]));
            match post[0] {
                "cgroup2" => v2.push(mount),
                "cgroup" => {
                    for opt in post[2].split(',') {
                        if V1_CONTROLLERS.contains(&opt) {
                            v1.entry(opt.to_string()).or_insert_with(|| mount.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        if v1.contains_key("memory") {
            return Some(CgroupLayout::V1 { mounts: v1 });
        }
        let mount = v2
            .iter()
            .find(|m| m.as_os_str() == "/sys/fs/cgroup")
            .or(v2.first())?
            .clone();
        Some(CgroupLayout::V2 { mount })
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
35 24 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
38 35 0:33 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
39 35 0:34 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
40 35 0:35 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
41 35 0:36 / /sys/fs/cgroup/devices rw,nosuid - cgroup cgroup rw,devices
42 35 0:37 / /sys/fs/cgroup/systemd rw,nosuid - cgroup cgroup rw,xattr,name=systemd
";

    #[test]
    fn v1_hierarchies_found() {
        let Some(CgroupLayout::V1 { mounts }) = CgroupLayout::from_mountinfo(HYBRID) else {
            panic!()
        };
        assert_eq!(mounts["cpu"], PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(
            mounts["cpuacct"],
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(mounts["memory"], PathBuf::from("/sys/fs/cgroup/memory"));
        assert!(!mounts.contains_key("freezer"));
    }

    #[test]
    fn v2_found() {
        let text = "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            CgroupLayout::from_mountinfo(text),
            Some(CgroupLayout::V2 {
                mount: PathBuf::from("/sys/fs/cgroup")
            })
        );
        assert_eq!(
            CgroupLayout::from_mountinfo("1 0 0:1 / / rw - ext4 /dev/vda rw\n"),
            None
        );
    }

    #[test]
    fn octal_escapes() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/a\0"), r"/a\0");
    }

    #[test]
    fn this_host_has_cgroups() {
        // Informational: every Linux CI host has some cgroup mount.
        assert!(CgroupLayout::detect().is_some());
    }
}
