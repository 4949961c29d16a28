//! NVIDIA GPUs through NVML (`nvml-wrapper`, library chosen with `--nvml-lib`).
//!
//! [`NvmlGpus::open`] loads the library and lists the GPUs once ([`GpuInventory`]: identity,
//! model, memory, compute capability, minor number, PCI bus id, NUMA node — NVML's memory
//! affinity where the driver has it, otherwise sysfs `numa_node` — and the PCI root the GPU
//! hangs off, from the sysfs device path). A host without the library or without GPUs gets `None`
//! and one log line: it runs as a CPU agent.
//!
//! Afterwards [`NvmlGpus::sample`] reads utilization, memory, temperature and power,
//! [`NvmlGpus::processes`] lists the compute processes per GPU, and [`NvmlGpus::watch_health`]
//! starts a thread blocked in `nvmlEventSetWait` that reports critical XIDs and double-bit ECC
//! errors (application XIDs filtered out, see [`crate::gpu::health`]). All calls are blocking:
//! call them from `spawn_blocking` or a dedicated thread.

use std::ffi::OsStr;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use gantry_proto::messages::{GpuInfo, GpuSample};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};
use tokio::sync::mpsc::UnboundedSender;

use crate::gpu::health::{FaultKind, GpuFault};
use crate::gpu::GpuSlot;

/// The library name the agent loads by default.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// `NVML_AFFINITY_SCOPE_NODE`.
const AFFINITY_SCOPE_NODE: u32 = 0;

/// Why NVML discovery failed.
#[derive(Debug, thiserror::Error)]
pub enum NvmlDiscoveryError {
    #[error("NVML: {0}")]
    Nvml(#[from] NvmlError),
    #[error("NVML reports no GPUs")]
    NoGpus,
}

/// One discovered GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoveredGpu {
    /// NVML index.
    pub index: u32,
    /// Identity and attributes as advertised to the master (`healthy` is `true` here),
    /// topology (NUMA node, PCI root) included.
    pub info: GpuInfo,
}

/// All GPUs of the host plus driver versions.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInventory {
    pub driver_version: String,
    /// CUDA driver API version, e.g. `"12.4"`.
    pub cuda_driver_version: String,
    /// What tasks are given: the physical GPUs not in MIG mode and the MIG devices of those
    /// in MIG mode (`info.mig_profile` set; `index` and topology are the parent's).
    pub gpus: Vec<DiscoveredGpu>,
    /// GPUs in MIG mode (not given to tasks whole; sampled and watched for faults).
    pub mig_parents: Vec<DiscoveredGpu>,
}

impl GpuInventory {
    /// The per-GPU identities and attributes to advertise.
    pub fn infos(&self) -> Vec<GpuInfo> {
        self.gpus.iter().map(|g| g.info.clone()).collect()
    }

    /// Topology slots for [`crate::gpu::assign`], all healthy and free, in inventory order.
    pub fn slots(&self) -> Vec<GpuSlot> {
        self.gpus
            .iter()
            .map(|g| GpuSlot {
                numa_node: g.info.numa_node,
                pci_root: g.info.pci_root.clone(),
                healthy: true,
                free: true,
            })
            .collect()
    }
}

/// A compute process NVML sees on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    pub uuid: String,
    pub pid: u32,
    pub used_bytes: u64,
}

/// An opened NVML with its GPUs.
pub struct NvmlGpus {
    nvml: Arc<Nvml>,
    inventory: GpuInventory,
}

impl std::fmt::Debug for NvmlGpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlGpus")
            .field("inventory", &self.inventory)
            .finish()
    }
}

impl NvmlGpus {
    /// Opens NVML at `lib` and lists its GPUs; `None` (with one info log line) when the library
    /// cannot be loaded or reports no GPUs: the agent then runs as a CPU agent.
    pub fn open(lib: &Path) -> Option<NvmlGpus> {
        match Self::try_open(lib, Path::new("/sys")) {
            Ok(g) => {
                tracing::info!(
                    gpus = g.inventory.gpus.len(),
                    driver = %g.inventory.driver_version,
                    cuda = %g.inventory.cuda_driver_version,
                    "NVML loaded from {}",
                    lib.display()
                );
                Some(g)
            }
            Err(e) => {
                tracing::info!(
                    "no GPUs: {e} (NVML library {}); running as a CPU agent",
                    lib.display()
                );
                None
            }
        }
    }

    /// Opens NVML; `sysfs` is normally `/sys` (tests pass a fake tree).
    pub fn try_open(lib: &Path, sysfs: &Path) -> Result<NvmlGpus, NvmlDiscoveryError> {
        let nvml = Nvml::builder().lib_path(lib.as_os_str()).init()?;
        let count = nvml.device_count()?;
        if count == 0 {
            return Err(NvmlDiscoveryError::NoGpus);
        }
        let driver_version = nvml.sys_driver_version()?;
        let cuda = nvml.sys_cuda_driver_version()?;
        let cuda_driver_version = format!("{}.{}", cuda / 1000, (cuda % 1000) / 10);
        let mut gpus = Vec::with_capacity(count as usize);
        let mut mig_parents = Vec::new();
        // The MIG calls nvml-wrapper 0.11 has no safe wrapper for, from the same library.
        // SAFETY: loading the library nvml-wrapper itself loaded (its initializers ran).
        let sys = unsafe { nvml_wrapper_sys::bindings::NvmlLib::new(lib.as_os_str()) }.ok();
        for index in 0..count {
            let d = nvml.device_by_index(index)?;
            let gpu = describe(index, &d, sysfs)?;
            let migs = sys
                .as_ref()
                .map(|sys| mig_devices(&nvml, sys, &d, &gpu))
                .unwrap_or_default();
            if migs.is_empty() {
                gpus.push(gpu);
            } else {
                tracing::info!(gpu = %gpu.info.uuid, mig_devices = migs.len(), "GPU in MIG mode: its MIG devices are offered");
                gpus.extend(migs);
                mig_parents.push(gpu);
            }
        }
        let inventory = GpuInventory {
            driver_version,
            cuda_driver_version,
            gpus,
            mig_parents,
        };
        Ok(NvmlGpus {
            nvml: Arc::new(nvml),
            inventory,
        })
    }

    /// The GPUs found at open.
    pub fn inventory(&self) -> &GpuInventory {
        &self.inventory
    }

    /// Samples every GPU. Figures a device does not support read as 0; a GPU whose handle can
    /// no longer be obtained is left out (and logged).
    pub fn sample(&self) -> Vec<GpuSample> {
        self.each_device(|g, d| {
            Ok(GpuSample {
                uuid: g.info.uuid.clone(),
                util_percent: or_zero(d.utilization_rates().map(|u| u.gpu))?,
                mem_used_bytes: or_zero(d.memory_info().map(|m| m.used))?,
                temperature_c: or_zero(d.temperature(TemperatureSensor::Gpu))?,
                power_mw: or_zero(d.power_usage())?,
            })
        })
        .into_iter()
        .collect()
    }

    /// Compute processes on every GPU.
    pub fn processes(&self) -> Vec<GpuProcess> {
        self.each_device(|g, d| {
            let procs = d.running_compute_processes()?;
            Ok(procs
                .into_iter()
                .map(|p| GpuProcess {
                    uuid: g.info.uuid.clone(),
                    pid: p.pid,
                    used_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => b,
                        UsedGpuMemory::Unavailable => 0,
                    },
                })
                .collect::<Vec<_>>())
        })
        .into_iter()
        .flatten()
        .collect()
    }

    /// The recovery check for an unhealthy GPU: the device answers identity, memory and
    /// temperature queries with its original identity.
    pub fn recovery_check(&self, uuid: &str) -> bool {
        let Some(g) = self.inventory.gpus.iter().find(|g| g.info.uuid == uuid) else {
            return false;
        };
        let check = || -> Result<bool, NvmlError> {
            let d = self.nvml.device_by_index(g.index)?;
            d.memory_info()?;
            d.temperature(TemperatureSensor::Gpu)?;
            // A MIG device is checked through its parent GPU.
            Ok(d.uuid()? == g.info.parent_uuid.as_deref().unwrap_or(uuid))
        };
        check().unwrap_or(false)
    }

    /// Starts the health watcher: a thread that owns an event set registered for critical XID
    /// and double-bit ECC events on every GPU and sends critical faults to `tx`. Application
    /// XIDs are dropped (logged at debug). The thread stops when the watcher is dropped or
    /// `tx`'s receiver is gone.
    pub fn watch_health(&self, tx: UnboundedSender<GpuFault>) -> HealthWatcher {
        let stop = Arc::new(AtomicBool::new(false));
        let nvml = self.nvml.clone();
        let gpus: Vec<(u32, String)> = self
            .physical()
            .map(|g| (g.index, g.info.uuid.clone()))
            .collect();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("nvml-health".to_string())
            .spawn(move || watch(&nvml, &gpus, &flag, &tx))
            .map_err(|e| tracing::error!("cannot start the NVML health watcher thread: {e}"))
            .ok();
        HealthWatcher { stop, thread }
    }

    /// The physical GPUs: those given whole and those in MIG mode (not their MIG devices).
    fn physical(&self) -> impl Iterator<Item = &DiscoveredGpu> + '_ {
        self.inventory
            .gpus
            .iter()
            .filter(|g| g.info.mig_profile.is_none())
            .chain(&self.inventory.mig_parents)
    }

    fn each_device<T>(
        &self,
        f: impl Fn(&DiscoveredGpu, &Device<'_>) -> Result<T, NvmlError>,
    ) -> Vec<T> {
        let mut out = Vec::with_capacity(self.inventory.gpus.len());
        for g in self.physical() {
            match self.nvml.device_by_index(g.index).and_then(|d| f(g, &d)) {
                Ok(v) => out.push(v),
                Err(e) => tracing::warn!(uuid = %g.info.uuid, "NVML query failed: {e}"),
            }
        }
        out
    }
}

fn or_zero<T: Default>(r: Result<T, NvmlError>) -> Result<T, NvmlError> {
    match r {
        Err(NvmlError::NotSupported) => Ok(T::default()),
        other => other,
    }
}

fn describe(index: u32, d: &Device<'_>, sysfs: &Path) -> Result<DiscoveredGpu, NvmlError> {
    let pci = d.pci_info()?;
    let cc = d.cuda_compute_capability()?;
    let sysfs_id = sysfs_pci_id(&pci.bus_id);
    let numa_node = nvml_numa_node(d).or_else(|| {
        sysfs_id
            .as_deref()
            .and_then(|id| sysfs_numa_node(sysfs, id))
    });
    let pci_root = sysfs_id.as_deref().and_then(|id| sysfs_pci_root(sysfs, id));
    Ok(DiscoveredGpu {
        index,
        info: GpuInfo {
            uuid: d.uuid()?,
            name: d.name()?,
            memory_mib: d.memory_info()?.total / (1024 * 1024),
            compute_capability: (cc.major, cc.minor),
            minor: d.minor_number()?,
            pci_bus_id: pci.bus_id,
            numa_node,
            pci_root,
            healthy: true,
            mig_profile: None,
            parent_uuid: None,
        },
    })
}

/// `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLED: u32 = 1;

/// The MIG devices of `d` when it is in MIG mode (empty otherwise, or when the driver lacks the
/// MIG calls): each with its MIG UUID, name, memory and profile, and the parent's topology.
fn mig_devices(
    nvml: &Nvml,
    sys: &nvml_wrapper_sys::bindings::NvmlLib,
    d: &Device<'_>,
    parent: &DiscoveredGpu,
) -> Vec<DiscoveredGpu> {
    if !d.mig_mode().is_ok_and(|m| m.current == MIG_ENABLED) {
        return Vec::new();
    }
    let (Ok(max_count), Ok(by_index)) = (
        sys.nvmlDeviceGetMaxMigDeviceCount.as_ref(),
        sys.nvmlDeviceGetMigDeviceHandleByIndex.as_ref(),
    ) else {
        tracing::warn!(gpu = %parent.info.uuid, "GPU in MIG mode but the NVML library lacks the MIG device calls");
        return Vec::new();
    };
    // SAFETY: a valid device handle and out-pointers to locals, per the NVML API.
    let handle = unsafe { d.handle() };
    let mut count: std::ffi::c_uint = 0;
    if unsafe { max_count(handle, &mut count) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..count.min(64) {
        let mut mig: nvml_wrapper_sys::bindings::nvmlDevice_t = std::ptr::null_mut();
        // SAFETY: as above; an index without a MIG device answers NOT_FOUND.
        if unsafe { by_index(handle, i, &mut mig) } != 0 || mig.is_null() {
            continue;
        }
        // SAFETY: a MIG device handle NVML just returned, used while `nvml` lives.
        let m = unsafe { Device::new(mig, nvml) };
        let described = (|| -> Result<GpuInfo, NvmlError> {
            let name = m.name()?;
            let memory_mib = m.memory_info()?.total / (1024 * 1024);
            Ok(GpuInfo {
                uuid: m.uuid()?,
                mig_profile: Some(mig_profile(&name, memory_mib)),
                parent_uuid: Some(parent.info.uuid.clone()),
                name,
                memory_mib,
                ..parent.info.clone()
            })
        })();
        match described {
            Ok(info) => out.push(DiscoveredGpu {
                index: parent.index,
                info,
            }),
            Err(e) => {
                tracing::warn!(gpu = %parent.info.uuid, mig = i, "MIG device query failed: {e}")
            }
        }
    }
    out
}

/// A MIG device's profile from its NVML name (`NVIDIA A100-SXM4-40GB MIG 1g.5gb` → `1g.5gb`);
/// when the name has none, `mig-<memory GiB>gb`.
pub fn mig_profile(name: &str, memory_mib: u64) -> String {
    match name.rsplit_once("MIG ") {
        Some((_, p)) if !p.trim().is_empty() => p.trim().to_string(),
        _ => format!("mig-{}gb", memory_mib.div_ceil(1024)),
    }
}

/// NVML's NUMA answer: the node set closest to the GPU, when it is exactly one node.
fn nvml_numa_node(d: &Device<'_>) -> Option<u32> {
    let words = d.memory_affinity(4, AFFINITY_SCOPE_NODE).ok()?;
    let bits = std::ffi::c_ulong::BITS;
    let set: Vec<u32> = words
        .iter()
        .enumerate()
        .flat_map(|(w, v)| {
            (0..bits)
                .filter(move |b| v & (1 << b) != 0)
                .map(move |b| w as u32 * bits + b)
        })
        .collect();
    (set.len() == 1).then(|| set[0])
}

/// NVML bus id (`00000000:3B:00.0`) to the sysfs name (`0000:3b:00.0`).
pub fn sysfs_pci_id(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.split_once(':')?;
    if domain.is_empty() || !domain.chars().all(|c| c.is_ascii_hexdigit()) || rest.len() != 7 {
        return None;
    }
    let domain = u32::from_str_radix(domain, 16).ok()?;
    if domain > 0xffff {
        return None;
    }
    Some(format!("{domain:04x}:{}", rest.to_ascii_lowercase()))
}

/// `<sysfs>/bus/pci/devices/<id>/numa_node`; `-1` (no NUMA) is `None`.
pub fn sysfs_numa_node(sysfs: &Path, id: &str) -> Option<u32> {
    let text =
        std::fs::read_to_string(sysfs.join("bus/pci/devices").join(id).join("numa_node")).ok()?;
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

/// The first two components of the device's real sysfs path under `devices/` (host bridge and
/// root port, e.g. `pci0000:00/0000:00:01.0`).
pub fn sysfs_pci_root(sysfs: &Path, id: &str) -> Option<String> {
    let real = std::fs::canonicalize(sysfs.join("bus/pci/devices").join(id)).ok()?;
    pci_root_of(&real)
}

fn pci_root_of(real: &Path) -> Option<String> {
    let comps: Vec<&OsStr> = real
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let host = comps
        .iter()
        .position(|c| c.to_string_lossy().starts_with("pci"))?;
    let bridge = comps[host].to_string_lossy();
    // The device itself right under the host bridge: its root is the bridge alone.
    match comps.get(host + 1) {
        Some(port) if host + 2 < comps.len() => {
            Some(format!("{bridge}/{}", port.to_string_lossy()))
        }
        _ => Some(bridge.into_owned()),
    }
}

/// Handle of the health watcher thread; dropping it stops the thread.
pub struct HealthWatcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HealthWatcher {
    /// Stops the thread and waits for it (at most one NVML wait period).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HealthWatcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How long one `nvmlEventSetWait` blocks, bounding how fast the watcher stops.
const WAIT_MS: u32 = 200;

fn register<'n>(nvml: &'n Nvml, gpus: &[(u32, String)]) -> Result<EventSet<'n>, NvmlError> {
    let mut set = nvml.create_event_set()?;
    for (index, uuid) in gpus {
        let d = nvml.device_by_index(*index)?;
        let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
        let types = match d.supported_event_types() {
            Ok(t) => t & wanted,
            Err(e) => {
                tracing::warn!(%uuid, "cannot query supported NVML events: {e}; no health events for this GPU");
                continue;
            }
        };
        if types.is_empty() {
            tracing::warn!(%uuid, "GPU supports neither XID nor ECC events; no health events for it");
            continue;
        }
        set = match d.register_events(types, set) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%uuid, "cannot register NVML events: {e}");
                nvml.create_event_set()?
            }
        };
    }
    Ok(set)
}

fn watch(nvml: &Nvml, gpus: &[(u32, String)], stop: &AtomicBool, tx: &UnboundedSender<GpuFault>) {
    let set = match register(nvml, gpus) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("NVML health watcher cannot start: {e}; GPU health is not monitored");
            return;
        }
    };
    while !stop.load(Ordering::SeqCst) && !tx.is_closed() {
        let ev = match set.wait(WAIT_MS) {
            Ok(ev) => ev,
            Err(NvmlError::Timeout) => continue,
            Err(e) => {
                tracing::warn!("NVML event wait failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(WAIT_MS.into()));
                continue;
            }
        };
        let uuid = match ev
            .device
            .index()
            .ok()
            .and_then(|i| gpus.iter().find(|(j, _)| *j == i))
        {
            Some((_, u)) => u.clone(),
            None => match ev.device.uuid() {
                Ok(u) => u,
                Err(e) => {
                    tracing::warn!("NVML event for an unknown device: {e}");
                    continue;
                }
            },
        };
        let kind = if ev.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
            FaultKind::DoubleBitEcc
        } else {
            match ev.event_data {
                Some(XidError::Value(x)) => FaultKind::Xid(x),
                Some(XidError::Unknown) => FaultKind::XidUnknown,
                None => continue,
            }
        };
        if !kind.is_critical() {
            tracing::debug!(%uuid, ?kind, "application XID ignored");
            continue;
        }
        tracing::warn!(%uuid, "GPU fault: {}", kind.reason());
        if tx.send(GpuFault { uuid, kind }).is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_map_to_sysfs_names() {
        assert_eq!(
            sysfs_pci_id("00000000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(
            sysfs_pci_id("0001:AF:00.0").as_deref(),
            Some("0001:af:00.0")
        );
        assert_eq!(sysfs_pci_id("zz:00:00.0"), None);
        assert_eq!(sysfs_pci_id("0000:00.0"), None);
    }

    #[test]
    fn pci_roots_from_device_paths() {
        let p = Path::new("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0");
        assert_eq!(pci_root_of(p).as_deref(), Some("pci0000:3a/0000:3a:00.0"));
        let p = Path::new("/sys/devices/pci0000:00/0000:00:04.0");
        assert_eq!(pci_root_of(p).as_deref(), Some("pci0000:00"));
        assert_eq!(pci_root_of(Path::new("/tmp/x")), None);
    }

    #[test]
    fn sysfs_numa_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir
            .path()
            .join("devices/pci0000:10/0000:10:01.0/0000:11:00.0");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("numa_node"), "1\n").unwrap();
        std::fs::create_dir_all(dir.path().join("bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("bus/pci/devices/0000:11:00.0")).unwrap();
        assert_eq!(sysfs_numa_node(dir.path(), "0000:11:00.0"), Some(1));
        assert_eq!(
            sysfs_pci_root(dir.path(), "0000:11:00.0").as_deref(),
            Some("pci0000:10/0000:10:01.0")
        );
        std::fs::write(real.join("numa_node"), "-1\n").unwrap();
        assert_eq!(sysfs_numa_node(dir.path(), "0000:11:00.0"), None);
        assert_eq!(sysfs_numa_node(dir.path(), "0000:99:00.0"), None);
    }
}

#[cfg(test)]
mod thread_safety {
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_cross_threads() {
        send_sync::<super::NvmlGpus>();
        send_sync::<super::HealthWatcher>();
    }
}
