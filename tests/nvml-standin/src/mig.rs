//! MIG: a GPU's MIG mode, its MIG devices' handles, and the way back to the parent.

use super::*;

/// `NVML_DEVICE_MIG_ENABLE`.
pub const NVML_DEVICE_MIG_ENABLE: c_uint = 1;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, g| {
        if current.is_null() || pending.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let mode = c_uint::from(!g.mig_devices.is_empty()) * NVML_DEVICE_MIG_ENABLE;
        unsafe {
            *current = mode;
            *pending = mode;
        }
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, g| {
        if count.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if g.mig_devices.is_empty() {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        unsafe { *count = MAX_MIG_DEVICES as c_uint };
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_state(|s| {
        let Some(g) = index_of(device) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        let Some(gpu) = s.config.gpus.get(g as usize) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        if mig_device.is_null() || index as usize >= MAX_MIG_DEVICES {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        if index as usize >= gpu.mig_devices.len() {
            return NVML_ERROR_NOT_FOUND;
        }
        unsafe { *mig_device = mig_handle_of(g, index) };
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    with_state(|_| unsafe { put(is_mig, c_uint::from(mig_index_of(device).is_some())) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_state(|_| {
        let Some((g, _)) = mig_index_of(mig_device) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        if device.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        unsafe { *device = handle_of(g) };
        NVML_SUCCESS
    })
}
