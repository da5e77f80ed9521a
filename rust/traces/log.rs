//! A trace's events held in columns: what a reader returns and what `prepare` walks, with no
//! object per event.

/// Event actions, in the order of `gpumm.traces.base.ACTIONS`.
pub const ACTIONS: &[&str] = &[
    "alloc",
    "free",
    "alloc_failed",
    "oom",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
];
pub const ALLOC: u8 = 0;
pub const FREE: u8 = 1;
pub const ALLOC_FAILED: u8 = 2;
pub const OOM: u8 = 3;
pub const SEGMENT_ALLOC: u8 = 4;
pub const SEGMENT_FREE: u8 = 5;
pub const SEGMENT_MAP: u8 = 6;
pub const SEGMENT_UNMAP: u8 = 7;

/// Events in columns. `thread` and `frames` may be empty: every event's is then 0 and -1.
#[derive(Clone, Debug, Default)]
pub struct Log {
    pub action: Vec<u8>,
    pub ptr: Vec<u64>,
    pub size: Vec<u64>,
    pub stream: Vec<u64>,
    pub time_us: Vec<i64>,
    pub thread: Vec<u64>,
    /// index into the trace's stack table, -1: none
    pub frames: Vec<i32>,
    /// (event, bytes free on the device) of each `oom` that recorded it
    pub device_free: Vec<(u32, u64)>,
}

/// What the real allocator held before the first event: (address, size, stream) of segments
/// and (address, requested, block size, stream) of live blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Start {
    pub segments: Vec<(u64, u64, u64)>,
    pub blocks: Vec<(u64, u64, u64, u64)>,
}

impl Log {
    pub fn len(&self) -> usize {
        self.action.len()
    }

    pub fn is_empty(&self) -> bool {
        self.action.is_empty()
    }

    pub fn push(&mut self, action: u8, ptr: u64, size: u64, stream: u64, time_us: i64) {
        self.action.push(action);
        self.ptr.push(ptr);
        self.size.push(size);
        self.stream.push(stream);
        self.time_us.push(time_us);
    }

    pub fn thread_of(&self, i: usize) -> u64 {
        self.thread.get(i).copied().unwrap_or(0)
    }

    pub fn frames_of(&self, i: usize) -> i32 {
        self.frames.get(i).copied().unwrap_or(-1)
    }

    /// Bytes the columns hold (their capacity, not only their length).
    pub fn nbytes(&self) -> usize {
        self.action.capacity()
            + 8 * (self.ptr.capacity()
                + self.size.capacity()
                + self.stream.capacity()
                + self.time_us.capacity()
                + self.thread.capacity())
            + 4 * self.frames.capacity()
            + 12 * self.device_free.capacity()
    }

    pub fn shrink(&mut self) {
        self.action.shrink_to_fit();
        self.ptr.shrink_to_fit();
        self.size.shrink_to_fit();
        self.stream.shrink_to_fit();
        self.time_us.shrink_to_fit();
        self.thread.shrink_to_fit();
        self.frames.shrink_to_fit();
        self.device_free.shrink_to_fit();
    }

    pub fn num_allocs(&self) -> usize {
        self.action.iter().filter(|&&a| a == ALLOC).count()
    }

    /// The largest sum of live requested sizes, counting the start state's blocks (sums
    /// saturate); frees of pointers not known to be live are ignored.
    pub fn peak_live(&self, start: Option<&Start>) -> u64 {
        let mut live = rustc_hash::FxHashMap::default();
        let mut cur = 0u64;
        for &(addr, req, _, _) in start.map(|s| s.blocks.as_slice()).unwrap_or(&[]) {
            live.insert(addr, req);
            cur = cur.saturating_add(req);
        }
        let mut peak = cur;
        for i in 0..self.len() {
            match self.action[i] {
                ALLOC => {
                    // an allocation at an address still live replaces it in the map but its
                    // bytes stay counted (the reader's rule since the first release)
                    live.insert(self.ptr[i], self.size[i]);
                    cur = cur.saturating_add(self.size[i]);
                    peak = peak.max(cur);
                }
                FREE => cur = cur.saturating_sub(live.remove(&self.ptr[i]).unwrap_or(0)),
                _ => {}
            }
        }
        peak
    }

    /// The peak of what the real allocator held: the start state's segments and the segment
    /// events after it.
    pub fn recorded_peak_reserved(&self, start: &Start) -> i128 {
        let mut cur: i128 = start.segments.iter().map(|s| s.1 as i128).sum();
        let mut peak = cur;
        for i in 0..self.len() {
            match self.action[i] {
                SEGMENT_ALLOC | SEGMENT_MAP => {
                    cur += self.size[i] as i128;
                    peak = peak.max(cur);
                }
                SEGMENT_FREE | SEGMENT_UNMAP => cur -= self.size[i] as i128,
                _ => {}
            }
        }
        peak
    }
}
