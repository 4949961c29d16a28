//! Events: event sets, registration and waiting for the XID and ECC events the configuration
//! file injects.

use super::*;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    with_device(device, |_, _| unsafe { put(types, SUPPORTED_EVENTS) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    with_state(|s| {
        if set.is_null() {
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        let id = s.next_set;
        s.next_set += 1;
        let delivered: HashSet<u64> = if s.config.replay_events {
            HashSet::new()
        } else {
            s.config
                .events
                .iter()
                .enumerate()
                .map(|(pos, e)| e.key(pos))
                .collect()
        };
        s.sets.insert(
            id,
            EventSetState {
                registered: HashMap::new(),
                delivered,
            },
        );
        unsafe { *set = id as nvmlEventSet_t };
        NVML_SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    with_state(|s| {
        let Some(i) = index_of(device).filter(|i| (*i as usize) < s.config.gpus.len()) else {
            return NVML_ERROR_INVALID_ARGUMENT;
        };
        if types & !SUPPORTED_EVENTS != 0 {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        match s.sets.get_mut(&(set as usize)) {
            Some(es) => {
                *es.registered.entry(i).or_insert(0) |= types;
                NVML_SUCCESS
            }
            None => NVML_ERROR_INVALID_ARGUMENT,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    with_state(|s| match s.sets.remove(&(set as usize)) {
        Some(_) => NVML_SUCCESS,
        None => NVML_ERROR_INVALID_ARGUMENT,
    })
}

/// Takes the next undelivered event for `set`, if any.
fn next_event(s: &mut State, set: usize) -> Result<Option<(u32, u64, u64)>, nvmlReturn_t> {
    let State { config, sets, .. } = s;
    let es = sets.get_mut(&set).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    for (pos, ev) in config.events.iter().enumerate() {
        let key = ev.key(pos);
        if es.delivered.contains(&key) {
            continue;
        }
        let bit = match ev.kind {
            EventKind::Xid => EVENT_XID,
            EventKind::DoubleBitEcc => EVENT_DOUBLE_BIT_ECC,
            EventKind::SingleBitEcc => EVENT_SINGLE_BIT_ECC,
        };
        if es.registered.get(&ev.gpu).is_some_and(|m| m & bit != 0) {
            es.delivered.insert(key);
            let data = if ev.kind == EventKind::Xid { ev.xid } else { 0 };
            return Ok(Some((ev.gpu, bit, data)));
        }
    }
    Ok(None)
}

unsafe fn event_wait(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    if data.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let deadline = Instant::now() + Duration::from_millis(timeout_ms.into());
    loop {
        let mut found = None;
        let rc = with_state(|s| match next_event(s, set as usize) {
            Ok(e) => {
                found = e;
                NVML_SUCCESS
            }
            Err(rc) => rc,
        });
        if rc != NVML_SUCCESS {
            return rc;
        }
        if let Some((gpu, kind, value)) = found {
            unsafe {
                *data = nvmlEventData_t {
                    device: handle_of(gpu),
                    eventType: kind,
                    eventData: value,
                    gpuInstanceId: u32::MAX,
                    computeInstanceId: u32::MAX,
                };
            }
            return NVML_SUCCESS;
        }
        let now = Instant::now();
        if now >= deadline {
            return NVML_ERROR_TIMEOUT;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(20)));
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    guard(|| unsafe { event_wait(set, data, timeout_ms) })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    guard(|| unsafe { event_wait(set, data, timeout_ms) })
}
