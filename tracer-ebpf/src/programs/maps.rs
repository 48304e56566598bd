//! Maps shared by every program, and the target filter and event emitter they all use.

use core::{
    intrinsics::{AtomicOrdering, atomic_xadd},
    mem::offset_of,
};

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_current_pid_tgid, bpf_get_stack, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use tracer_ebpf::{
    abi::{
        Config, DataEvent, Drops, Event, LOSS_SLOT, Loss, STACK_ENTRIES, STACK_FRAMES, Stack,
        TARGET_SOCKS_ENTRIES,
    },
    tracepoints::Field,
};

/// Default ring size; user space overrides it (`--ring-mib`) before loading.
const DEFAULT_RING_BYTES: u32 = 1 << 24;

#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

#[map]
pub static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

#[map]
pub static LOSS: PerCpuArray<Loss> = PerCpuArray::with_max_entries(1, 0);

#[map]
pub static DROPS: PerCpuArray<Drops> = PerCpuArray::with_max_entries(1, 0);

/// Threads of the target: seeded from /proc/PID/task, extended by fork and in-context events,
/// pruned at exit. Needed where the program runs in another task's context (switch-in, wakeup).
#[map]
pub static TIDS: HashMap<u32, u8> = HashMap::with_max_entries(4096, 0);

/// Kernel-only mode: the target's processes (tgid → 1), seeded by user space with each
/// `--pid` and its descendants, extended at fork, pruned at a process's exit. Unused (never
/// looked up) in exact mode.
#[map]
pub static TGIDS: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);

/// Sockets the target has touched (sk pointer → last fd sent, `u64::MAX` if not yet known).
/// Entries go at TCP_CLOSE; LRU so that a missed close can never fill the map.
#[map]
pub static TARGET_SOCKS: LruHashMap<u64, u64> =
    LruHashMap::with_max_entries(TARGET_SOCKS_ENTRIES, 0);

/// Kernel-only mode: TGIDS's version, moved on by every change to it (fork and exit programs,
/// and user space once it has seeded it), so that a [`TGID_CACHE`] verdict from before is not
/// taken.
#[map]
pub static TGIDS_VERSION: Array<u64> = Array::with_max_entries(1, 0);

/// Kernel-only mode: the last tgid each CPU looked up in TGIDS and the answer, with the
/// TGIDS_VERSION it was given under. A CPU asks about the same process over and over (the
/// proxy's worker at each of its syscalls), and an array read is a few instructions where a
/// hash lookup is a helper call and a hash.
#[map]
static TGID_CACHE: PerCpuArray<TgidVerdict> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct TgidVerdict {
    version: u64,
    tgid: u32,
    target: u32,
}

/// Local TCP ports the target listens on (host byte order).
#[map]
pub static LISTEN_PORTS: HashMap<u16, u8> = HashMap::with_max_entries(64, 0);

/// Stacks by id, the id a 63-bit hash of the frames: taken with `bpf_get_stack` and kept here
/// by the programs rather than in a BPF_MAP_TYPE_STACK_TRACE, whose id is the hash's bucket:
/// there, a stack whose bucket holds another one is not taken (-EEXIST), and with 16384
/// buckets a session lost hundreds of stacks that way. Here only a full map loses one.
#[map]
pub static STACKS: HashMap<u64, Stack> = HashMap::with_max_entries(STACK_ENTRIES, 0);

/// Where `bpf_get_stack` writes (a stack is too big for the 512-byte BPF stack): a slot per
/// kind of caller, [`STACK_SLOT_SWITCH`] and [`STACK_SLOT_SAMPLE`], so that a program that
/// interrupts another never writes into the slot the other is hashing.
#[map]
static STACK_SCRATCH: PerCpuArray<Stack> = PerCpuArray::with_max_entries(2, 0);

/// sched_switch (runs with interrupts off, so nothing of ours takes a stack inside it).
pub const STACK_SLOT_SWITCH: u32 = 0;
/// The cpu-clock sample (hard IRQ; never nested in itself).
pub const STACK_SLOT_SAMPLE: u32 = 1;

/// The target's configuration; `None` before user space wrote `CONFIG`, or when the programs
/// are to do nothing (`Config::EMPTY_PROGRAMS`). Every program asks this first.
#[inline(always)]
pub fn config() -> Option<&'static Config> {
    CONFIG
        .get(0)
        .filter(|config| config.tgid != 0 && config.flags & Config::EMPTY_PROGRAMS == 0)
}

/// (tgid, tid) of the current task.
#[inline(always)]
pub fn current() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

/// Whether `tgid` is a target process: `config.tgid`, or in kernel-only mode any in TGIDS
/// (exact mode pays one more compare-and-branch on a miss, never a lookup; neither mode looks
/// up the idle task, 0, which half the machine's switches leave).
#[inline(always)]
pub fn is_target_tgid(config: &Config, tgid: u32) -> bool {
    tgid == config.tgid || (config.flags & Config::KERNEL_ONLY != 0 && tgid != 0 && in_tgids(tgid))
}

/// Whether TGIDS holds `tgid`, through this CPU's [`TGID_CACHE`] entry.
#[inline(always)]
fn in_tgids(tgid: u32) -> bool {
    let version = TGIDS_VERSION.get(0).copied().unwrap_or(0);
    let cache = TGID_CACHE.get_ptr_mut(0);
    if let Some(cache) = cache {
        // SAFETY: this CPU's entry. A program that interrupts this one here (a cpu-clock
        // sample) asks about the same current task, so whatever mix of the two writes is
        // left holds the same tgid and answer.
        let entry = unsafe { *cache };
        if entry.tgid == tgid && entry.version == version {
            return entry.target != 0;
        }
    }
    // SAFETY: only tested for presence.
    let target = unsafe { TGIDS.get(tgid) }.is_some();
    if let Some(cache) = cache {
        // SAFETY: as above.
        unsafe {
            *cache = TgidVerdict {
                version,
                tgid,
                target: u32::from(target),
            }
        };
    }
    target
}

/// Moves TGIDS_VERSION on after a change to TGIDS.
#[inline(always)]
pub fn tgids_changed() {
    if let Some(version) = TGIDS_VERSION.get_ptr_mut(0) {
        bump(version);
    }
}

/// The current thread's tid if it belongs to the target.
#[inline(always)]
pub fn current_target_tid() -> Option<u32> {
    current_target().map(|(_, _, tid)| tid)
}

/// (tgid, tid) of the current thread if it belongs to the target.
#[inline(always)]
pub fn current_target() -> Option<(&'static Config, u32, u32)> {
    let config = config()?;
    let (tgid, tid) = current();
    is_target_tgid(config, tgid).then_some((config, tgid, tid))
}

/// Kernel-only mode: adds `tgid` to TGIDS, counting a full map as `tids_full`.
#[inline(always)]
pub fn add_target_tgid(tgid: u32) {
    if TGIDS.insert(tgid, 1, 0).is_err() {
        count_drop(offset_of!(Drops, tids_full));
    }
    tgids_changed();
}

/// Adds `tid` to TIDS, counting a full map.
#[inline(always)]
pub fn add_target_tid(tid: u32) {
    if TIDS.insert(tid, 1, 0).is_err() {
        count_drop(offset_of!(Drops, tids_full));
    }
}

#[inline(always)]
pub fn is_target_tid(tid: u32) -> bool {
    // SAFETY: the value is a plain u8 and is only read, not kept.
    unsafe { TIDS.get(tid) }.is_some()
}

#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// Adds one to a per-CPU counter, atomically: programs do nest on a CPU. A uprobe (since
/// 5.19) does not take `bpf_prog_active`, so a tracepoint, kprobe or perf_event program can
/// run inside it when an interrupt hits, a cpu-clock sample in hard IRQ can interrupt any
/// program, and `fentry_sock_def_readable` runs in softirq. A plain load and store would lose
/// one of two nested counts. The result is unused, so LLVM emits `lock *(u64 *)(r + 0) += r`
/// (BPF_ATOMIC | BPF_ADD, no BPF_FETCH), which every kernel with BPF_XADD accepts.
#[inline(always)]
fn bump(counter: *mut u64) {
    // SAFETY: `counter` points to an aligned u64 inside a live per-CPU map value.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(counter, 1) };
}

/// Counts one thing the programs could not do: `field` is `offset_of!(Drops, <field>)`.
#[inline(always)]
pub fn count_drop(field: usize) {
    if let Some(drops) = DROPS.get_ptr_mut(0) {
        // SAFETY: `field` is the offset of a u64 field inside the live map value.
        bump(unsafe { drops.cast::<u8>().add(field).cast::<u64>() });
    }
}

/// Writes one event, or counts it as lost when the ring is full. The reader is not woken
/// (it drains on a timer) unless the ring is filling up: a wakeup from a program is an
/// irq_work self-IPI, which in a VM is an exit, paid on the target's CPU.
#[inline(always)]
pub fn emit(ts_ns: u64, tid: u32, kind: u16, sub: u16, args: [u64; 3]) {
    match EVENTS.reserve::<Event>(0) {
        Some(mut entry) => {
            entry.write(Event {
                ts_ns,
                tid,
                kind,
                sub,
                args,
            });
            entry.submit(submit_flags());
        }
        None => count_loss(ts_ns),
    }
}

/// Kernel-only mode: writes one [`DataEvent`] whose `event` is as [`emit`] would write it,
/// with `tgid`, and whose bytes `fill` copies straight into the reserved record (returning how
/// many it captured); or counts it as lost, as `emit` does.
#[inline(always)]
pub fn emit_data(
    event: Event,
    tgid: u32,
    fill: impl FnOnce(*mut [u8; tracer_ebpf::abi::DATA_BYTES]) -> u32,
) {
    match EVENTS.reserve::<DataEvent>(0) {
        Some(mut entry) => {
            let record = entry.as_mut_ptr();
            // SAFETY: `record` is the reserved, writable record of `size_of::<DataEvent>()`
            // bytes; every field is written before submit (the bytes past `captured` are
            // whatever the ring held, and are never read: `captured` bounds them).
            unsafe {
                (*record).event = event;
                (*record).tgid = tgid;
                let captured = fill(&raw mut (*record).bytes);
                (*record).captured = captured;
            }
            entry.submit(submit_flags());
        }
        None => count_loss(event.ts_ns),
    }
}

/// The submit flags: wake the reader only once the ring holds more than the threshold.
#[inline(always)]
fn submit_flags() -> u64 {
    let threshold = config().map_or(0, |c| c.wakeup_bytes);
    let flags = if EVENTS.query(u64::from(BPF_RB_AVAIL_DATA)) > threshold {
        count_drop(offset_of!(Drops, forced_wakeups));
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    u64::from(flags)
}

/// An event that could not be reserved: counted in LOSS.
#[inline(always)]
fn count_loss(ts_ns: u64) {
    if let Some(loss) = LOSS.get_ptr_mut(LOSS_SLOT) {
        // SAFETY: a live per-CPU slot (see `bump`). The count is exact; if a nested
        // program also loses an event, `last_ts_ns` keeps one of the two times, and the
        // loss span user space builds still covers both (it starts at the previous poll).
        unsafe {
            bump(&raw mut (*loss).count);
            (*loss).last_ts_ns = ts_ns;
        }
    }
}

/// Reads a field of a classic tracepoint record directly from the context. The verifier
/// bounds-checks these reads; offsets are verified against tracefs at attach time.
#[inline(always)]
pub fn field<T: Copy>(ctx: &aya_ebpf::programs::TracePointContext, field: Field) -> T {
    use aya_ebpf::EbpfContext as _;
    // SAFETY: tracepoint contexts are readable in place for the record's size; the offset is a
    // compile-time constant the user side checked against the tracepoint's format file.
    unsafe { core::ptr::read(ctx.as_ptr().cast::<u8>().add(field.offset).cast::<T>()) }
}

/// Reads a `T` at `offset` bytes into the kernel object at `base`; the default (0) when it
/// cannot be read.
#[inline(always)]
pub fn read_kernel<T: Copy + Default>(base: u64, offset: u32) -> T {
    // SAFETY: bpf_probe_read_kernel checks the address itself and fails rather than faults.
    unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T) }.unwrap_or_default()
}

/// FNV-1a's 64-bit parameters.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The id of the current stack (kernel, or user with `BPF_F_USER_STACK` in `flags`), kept in
/// STACKS: a 63-bit hash of its frames, so non-negative as an i64. -1 (as u64) when it could not
/// be taken, counted in `stack_failed` (the event still goes out).
#[inline(always)]
pub fn stack_id<C: EbpfContext>(ctx: &C, slot: u32, flags: u64) -> u64 {
    const NONE: u64 = -1i64 as u64;
    let Some(stack) = STACK_SCRATCH.get_ptr_mut(slot) else {
        return NONE;
    };
    // SAFETY: `stack` is a live per-CPU map value of exactly `size_of::<Stack>()` bytes; the
    // helper zeroes what the frames do not fill.
    let len =
        unsafe { bpf_get_stack(ctx.as_ptr(), stack.cast(), size_of::<Stack>() as u32, flags) };
    if len <= 0 {
        count_drop(offset_of!(Drops, stack_failed));
        return NONE;
    }
    let frames = len as usize / size_of::<u64>();
    // SAFETY: as above; only this program writes this slot on this CPU.
    let stack = unsafe { &*stack };
    let mut hash = FNV_OFFSET;
    for i in 0..STACK_FRAMES {
        if i >= frames {
            break;
        }
        hash = (hash ^ stack.ips[i]).wrapping_mul(FNV_PRIME);
    }
    let id = hash >> 1;
    // SAFETY: only tested for presence.
    if unsafe { STACKS.get(id) }.is_some() {
        return id;
    }
    match STACKS.insert(id, stack, u64::from(BPF_NOEXIST)) {
        // -EEXIST: another CPU stored the same stack in between.
        Ok(()) | Err(-17) => id,
        Err(_) => {
            count_drop(offset_of!(Drops, stack_failed));
            NONE
        }
    }
}
