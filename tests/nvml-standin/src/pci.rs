//! PCI: bus ids, PCI info and the NUMA affinity of a device.

use super::*;

/// Parses `DDDDDDDD:BB:DD.F` (or `DDDD:BB:DD.F`) into (domain, bus, device).
pub(crate) fn parse_bus_id(id: &str) -> Option<(u32, u32, u32)> {
    let mut parts = id.split(':');
    let domain = u32::from_str_radix(parts.next()?, 16).ok()?;
    let bus = u32::from_str_radix(parts.next()?, 16).ok()?;
    let dev = parts.next()?.split('.').next()?;
    let device = u32::from_str_radix(dev, 16).ok()?;
    Some((domain, bus, device))
}

unsafe fn pci_info(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    with_device(device, |_, g| {
        if pci.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let (domain, bus, dev) = parse_bus_id(&g.pci_bus_id).unwrap_or((0, 0, 0));
        let legacy = format!("{:04X}:{:02X}:{:02X}.0", domain & 0xffff, bus, dev);
        let out = unsafe { &mut *pci };
        fill_array(&mut out.busIdLegacy, &legacy);
        fill_array(&mut out.busId, &g.pci_bus_id);
        out.domain = domain;
        out.bus = bus;
        out.device = dev;
        out.pciDeviceId = 0x20B0_10DE;
        out.pciSubSystemId = 0x1450_10DE;
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    pci_info(device, pci)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    pci_info(device, pci)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device: nvmlDevice_t,
    node_set_size: c_uint,
    node_set: *mut c_ulong,
    _scope: c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, g| {
        let Some(node) = g.numa_node else {
            return NVML_ERROR_NOT_SUPPORTED;
        };
        if node_set.is_null() || node_set_size == 0 {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let bits = c_ulong::BITS;
        let word = (node / bits) as usize;
        if word >= node_set_size as usize {
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        let words = unsafe { std::slice::from_raw_parts_mut(node_set, node_set_size as usize) };
        words.fill(0);
        words[word] = 1 << (node % bits);
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    device: nvmlDevice_t,
    node: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, g| match g.numa_node {
        None => NVML_ERROR_NOT_SUPPORTED,
        Some(_) if node.is_null() => NVML_ERROR_INVALID_ARGUMENT,
        Some(n) => {
            unsafe { *node = n };
            NVML_SUCCESS
        }
    })
}
