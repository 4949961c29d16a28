//! # gantry-nvml-standin
//!
//! A stand-in for `libnvidia-ml.so` for machines without NVIDIA GPUs. Built as a `cdylib`, it
//! exports (with the real NVML C ABI) every NVML function the Gantry agent calls through
//! `nvml-wrapper`, answering from a configuration file named by the environment variable
//! [`config::CONFIG_ENV`] (`GANTRY_NVML_STANDIN_CONFIG`). The agent loads it with
//! `--nvml-lib target/debug/libgantry_nvml_standin.so`, so tests exercise the production path.
//!
//! Rules kept by every exported function: never unwind across `extern "C"` (each body runs in
//! `catch_unwind` and a panic becomes `NVML_ERROR_UNKNOWN`); strings are NUL-terminated inside
//! the caller's buffer, or `NVML_ERROR_INSUFFICIENT_SIZE` is returned; every call re-reads the
//! configuration file, so tests inject XID events or change processes at run time.
//!
//! Build it with `cargo build -p gantry-nvml-standin`; [`config::library_path`] finds it.
//!
//! Modules: this one holds the ABI types, the state, initialisation and the device queries;
//! [`config`] the configuration file; [`mig`] MIG devices; [`pci`] bus ids, PCI info and NUMA
//! affinity; [`events`] event sets and waits.

#![allow(non_snake_case, non_camel_case_types, clippy::missing_safety_doc)]

pub mod config;
pub mod events;
pub mod mig;
pub mod pci;

use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_uint, c_ulong, c_ulonglong, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use config::{EventKind, GpuSpec, StandinConfig, CONFIG_ENV, MAX_MIG_DEVICES};

/// `nvmlReturn_t`.
pub type nvmlReturn_t = c_uint;
/// Opaque device handle.
pub type nvmlDevice_t = *mut c_void;
/// Opaque event-set handle.
pub type nvmlEventSet_t = *mut c_void;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_TIMEOUT: nvmlReturn_t = 10;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// `nvmlEventTypeSingleBitEccError`.
pub const EVENT_SINGLE_BIT_ECC: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`.
pub const EVENT_DOUBLE_BIT_ECC: u64 = 0x2;
/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID: u64 = 0x8;
const SUPPORTED_EVENTS: u64 = EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID;

/// `nvmlPciInfo_t` (v3 layout).
#[repr(C)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pciDeviceId: c_uint,
    pub pciSubSystemId: c_uint,
    pub busId: [c_char; 32],
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct nvmlMemory_t {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct nvmlUtilization_t {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlProcessInfo_t` (v2/v3 layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// `nvmlEventData_t`.
#[repr(C)]
pub struct nvmlEventData_t {
    pub device: nvmlDevice_t,
    pub eventType: c_ulonglong,
    pub eventData: c_ulonglong,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

const MAX_GPUS: usize = 64;
/// Device handles point into this array; the offset is the GPU index.
static HANDLES: [u8; MAX_GPUS] = [0; MAX_GPUS];
/// MIG device handles point into this array; the offset is `gpu * MAX_MIG_DEVICES + mig`.
static MIG_HANDLES: [u8; MAX_GPUS * MAX_MIG_DEVICES] = [0; MAX_GPUS * MAX_MIG_DEVICES];

struct EventSetState {
    /// GPU index -> registered event mask.
    registered: HashMap<u32, u64>,
    delivered: HashSet<u64>,
}

struct State {
    init_count: u32,
    path: PathBuf,
    config: StandinConfig,
    sets: HashMap<usize, EventSetState>,
    next_set: usize,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn lock() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

impl State {
    /// Re-reads the configuration; a file that cannot be read or parsed keeps the last good one.
    fn refresh(&mut self) {
        if let Ok(c) = StandinConfig::load(&self.path) {
            self.config = c;
        }
    }
}

/// Runs `f` on the initialized, refreshed state; `NVML_ERROR_UNINITIALIZED` otherwise.
fn with_state(f: impl FnOnce(&mut State) -> nvmlReturn_t) -> nvmlReturn_t {
    guard(|| {
        let mut g = lock();
        match g.as_mut() {
            Some(s) if s.init_count > 0 => {
                s.refresh();
                f(s)
            }
            _ => NVML_ERROR_UNINITIALIZED,
        }
    })
}

fn guard(f: impl FnOnce() -> nvmlReturn_t) -> nvmlReturn_t {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(NVML_ERROR_UNKNOWN)
}

fn handle_of(index: u32) -> nvmlDevice_t {
    HANDLES.as_ptr().wrapping_add(index as usize) as *mut c_void
}

fn index_of(handle: nvmlDevice_t) -> Option<u32> {
    let base = HANDLES.as_ptr() as usize;
    let p = handle as usize;
    (p >= base && p < base + MAX_GPUS).then(|| (p - base) as u32)
}

fn mig_handle_of(gpu: u32, mig: u32) -> nvmlDevice_t {
    MIG_HANDLES
        .as_ptr()
        .wrapping_add(gpu as usize * MAX_MIG_DEVICES + mig as usize) as *mut c_void
}

/// `(gpu index, MIG index)` of a MIG device handle.
fn mig_index_of(handle: nvmlDevice_t) -> Option<(u32, u32)> {
    let base = MIG_HANDLES.as_ptr() as usize;
    let p = handle as usize;
    (p >= base && p < base + MIG_HANDLES.len()).then(|| {
        let off = p - base;
        (
            (off / MAX_MIG_DEVICES) as u32,
            (off % MAX_MIG_DEVICES) as u32,
        )
    })
}

/// A MIG device seen as a device of its own: the parent's attributes with the MIG device's
/// uuid, name and memory, and no processes of its own.
fn mig_view(gpu: &GpuSpec, mig: &config::MigSpec) -> GpuSpec {
    GpuSpec {
        uuid: mig.uuid.clone(),
        name: format!("{} MIG {}", gpu.name, mig.profile),
        memory_mib: mig.memory_mib,
        memory_used_mib: Some(0),
        processes: Vec::new(),
        mig_devices: Vec::new(),
        ..gpu.clone()
    }
}

/// Runs `f` with the GPU a device handle names (for a MIG device handle: the parent's index
/// and the MIG device's view).
fn with_device(
    device: nvmlDevice_t,
    f: impl FnOnce(u32, &GpuSpec) -> nvmlReturn_t,
) -> nvmlReturn_t {
    with_state(|s| {
        if let Some((g, m)) = mig_index_of(device) {
            return match s.config.gpus.get(g as usize) {
                Some(gpu) => match gpu.mig_devices.get(m as usize) {
                    Some(mig) => f(g, &mig_view(gpu, mig)),
                    None => NVML_ERROR_INVALID_ARGUMENT,
                },
                None => NVML_ERROR_INVALID_ARGUMENT,
            };
        }
        match index_of(device) {
            Some(i) => match s.config.gpus.get(i as usize) {
                Some(gpu) => f(i, gpu),
                None => NVML_ERROR_INVALID_ARGUMENT,
            },
            None => NVML_ERROR_INVALID_ARGUMENT,
        }
    })
}

/// Writes `value` through the caller's out-pointer `out` (`NVML_ERROR_INVALID_ARGUMENT` when
/// it is null).
unsafe fn put<T>(out: *mut T, value: T) -> nvmlReturn_t {
    if out.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsafe { out.write(value) };
    NVML_SUCCESS
}

/// Copies `s` and a NUL into `buf` of `len` bytes.
unsafe fn write_str(buf: *mut c_char, len: c_uint, s: &str) -> nvmlReturn_t {
    if buf.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr() as *const c_char, buf, bytes.len());
    *buf.add(bytes.len()) = 0;
    NVML_SUCCESS
}

fn fill_array<const N: usize>(dst: &mut [c_char; N], s: &str) {
    *dst = [0; N];
    for (d, b) in dst.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = b as c_char;
    }
}

fn mib(v: u64) -> u64 {
    v.saturating_mul(1024 * 1024)
}

fn used_bytes(gpu: &GpuSpec) -> u64 {
    match gpu.memory_used_mib {
        Some(m) => mib(m),
        None => gpu.processes.iter().map(|p| mib(p.used_memory_mib)).sum(),
    }
    .min(mib(gpu.memory_mib))
}

fn init() -> nvmlReturn_t {
    guard(|| {
        let mut g = lock();
        if let Some(s) = g.as_mut() {
            if s.init_count > 0 {
                s.init_count += 1;
                s.refresh();
                return NVML_SUCCESS;
            }
        }
        let Some(path) = std::env::var_os(CONFIG_ENV) else {
            eprintln!("gantry-nvml-standin: {CONFIG_ENV} is not set; behaving as a host without an NVIDIA driver");
            return NVML_ERROR_DRIVER_NOT_LOADED;
        };
        let path = PathBuf::from(path);
        match StandinConfig::load(&path) {
            Ok(config) => {
                *g = Some(State {
                    init_count: 1,
                    path,
                    config,
                    sets: HashMap::new(),
                    next_set: 1,
                });
                NVML_SUCCESS
            }
            Err(e) => {
                eprintln!("gantry-nvml-standin: {e}; behaving as a host without an NVIDIA driver");
                NVML_ERROR_DRIVER_NOT_LOADED
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    init()
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    init()
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(|| {
        let mut g = lock();
        match g.as_mut() {
            Some(s) if s.init_count > 0 => {
                s.init_count -= 1;
                if s.init_count == 0 {
                    *g = None;
                }
                NVML_SUCCESS
            }
            _ => NVML_ERROR_UNINITIALIZED,
        }
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static CStr = match result {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        NVML_ERROR_NOT_FOUND => c"Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        NVML_ERROR_TIMEOUT => c"Timeout",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument Version Mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_state(|s| unsafe { write_str(version, length, &s.config.driver_version) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_state(|s| {
        let v = format!(
            "{}.{}",
            s.config.cuda_version / 1000,
            s.config.driver_version
        );
        unsafe { write_str(version, length, &v) }
    })
}

unsafe fn cuda_version(out: *mut c_int) -> nvmlReturn_t {
    with_state(|s| unsafe { put(out, s.config.cuda_version) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    cuda_version(v)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    cuda_version(v)
}

unsafe fn device_count(count: *mut c_uint) -> nvmlReturn_t {
    with_state(|s| unsafe { put(count, s.config.gpus.len().min(MAX_GPUS) as c_uint) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    device_count(count)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t {
    device_count(count)
}

unsafe fn handle_by_index(index: c_uint, device: *mut nvmlDevice_t) -> nvmlReturn_t {
    with_state(|s| {
        if device.is_null() || index as usize >= s.config.gpus.len().min(MAX_GPUS) {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        unsafe { *device = handle_of(index) };
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    handle_by_index(index, device)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    handle_by_index(index, device)
}

unsafe fn handle_by(
    key: *const c_char,
    device: *mut nvmlDevice_t,
    pick: fn(&GpuSpec) -> &str,
) -> nvmlReturn_t {
    with_state(|s| {
        if key.is_null() || device.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let Ok(key) = unsafe { CStr::from_ptr(key) }.to_str() else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        match s
            .config
            .gpus
            .iter()
            .take(MAX_GPUS)
            .position(|g| pick(g).eq_ignore_ascii_case(key))
        {
            Some(i) => {
                unsafe { *device = handle_of(i as u32) };
                NVML_SUCCESS
            }
            None => NVML_ERROR_NOT_FOUND,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    handle_by(uuid, device, |g| &g.uuid)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    handle_by(bus_id, device, |g| &g.pci_bus_id)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |i, _| unsafe { put(index, i) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, g| unsafe { write_str(name, length, &g.name) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, g| unsafe { write_str(uuid, length, &g.uuid) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, g| unsafe { put(minor, g.minor) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    with_device(device, |_, g| {
        if major.is_null() || minor.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        unsafe {
            *major = g.compute_capability.0;
            *minor = g.compute_capability.1;
        }
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    with_device(device, |_, g| {
        if memory.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let total = mib(g.memory_mib);
        let used = used_bytes(g);
        unsafe {
            *memory = nvmlMemory_t {
                total,
                free: total - used,
                used,
            }
        };
        NVML_SUCCESS
    })
}

/// `NVML_STRUCT_VERSION(Memory, 2)`.
const MEMORY_V2_VERSION: c_uint = (std::mem::size_of::<nvmlMemory_v2_t>() as c_uint) | (2 << 24);

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    with_device(device, |_, g| {
        if memory.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if unsafe { (*memory).version } != MEMORY_V2_VERSION {
            return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        }
        let total = mib(g.memory_mib);
        let used = used_bytes(g);
        unsafe {
            *memory = nvmlMemory_v2_t {
                version: MEMORY_V2_VERSION,
                total,
                reserved: 0,
                free: total - used,
                used,
            };
        }
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    with_device(device, |_, g| {
        if utilization.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        unsafe {
            *utilization = nvmlUtilization_t {
                gpu: g.utilization_gpu,
                memory: g.utilization_memory,
            }
        };
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: c_uint,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, g| {
        if temp.is_null() || sensor != 0 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        unsafe { *temp = g.temperature_c };
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, g| unsafe { put(power, g.power_mw) })
}

unsafe fn processes(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
    graphics: bool,
) -> nvmlReturn_t {
    with_device(device, |_, g| {
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let procs: &[config::ProcessSpec] = if graphics { &[] } else { &g.processes };
        let n = procs.len() as c_uint;
        let capacity = unsafe { *count };
        unsafe { *count = n };
        if capacity < n {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        if n == 0 {
            return NVML_SUCCESS;
        }
        if infos.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        for (i, p) in procs.iter().enumerate() {
            unsafe {
                *infos.add(i) = nvmlProcessInfo_t {
                    pid: p.pid,
                    usedGpuMemory: mib(p.used_memory_mib),
                    gpuInstanceId: u32::MAX,
                    computeInstanceId: u32::MAX,
                };
            }
        }
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    processes(device, count, infos, false)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    processes(device, count, infos, false)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    processes(device, count, infos, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_parse() {
        assert_eq!(pci::parse_bus_id("00000000:3B:00.0"), Some((0, 0x3b, 0)));
        assert_eq!(pci::parse_bus_id("0001:af:1f.0"), Some((1, 0xaf, 0x1f)));
        assert_eq!(pci::parse_bus_id("junk"), None);
    }

    #[test]
    fn strings_respect_buffer_size() {
        let mut buf = [1 as c_char; 6];
        assert_eq!(
            unsafe { write_str(buf.as_mut_ptr(), 6, "hello!") },
            NVML_ERROR_INSUFFICIENT_SIZE
        );
        assert_eq!(
            unsafe { write_str(buf.as_mut_ptr(), 6, "hello") },
            NVML_SUCCESS
        );
        assert_eq!(buf[5], 0);
        assert_eq!(
            unsafe { write_str(std::ptr::null_mut(), 6, "x") },
            NVML_ERROR_INVALID_ARGUMENT
        );
    }

    #[test]
    fn handles_round_trip() {
        for i in [0u32, 1, 63] {
            assert_eq!(index_of(handle_of(i)), Some(i));
        }
        assert_eq!(index_of(std::ptr::null_mut()), None);
    }

    #[test]
    fn config_parses_toml_and_json() {
        let toml_text = r#"
            driver_version = "1.2.3"
            [[gpus]]
            uuid = "GPU-a"
            name = "Sim"
            memory_mib = 1024
            minor = 0
            pci_bus_id = "00000000:01:00.0"
            numa_node = 1
            processes = [{ pid = 7, used_memory_mib = 10 }]
            [[events]]
            gpu = 0
            kind = "xid"
            xid = 79
        "#;
        let c = StandinConfig::parse(std::path::Path::new("x.toml"), toml_text).unwrap();
        assert_eq!(c.gpus[0].numa_node, Some(1));
        assert_eq!(c.events[0].kind, EventKind::Xid);
        let json = c.render(std::path::Path::new("x.json"));
        assert_eq!(
            StandinConfig::parse(std::path::Path::new("x.json"), &json).unwrap(),
            c
        );
        assert!(StandinConfig::parse(std::path::Path::new("x.toml"), "gpus = 3").is_err());
    }
}
