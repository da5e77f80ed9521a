//! A trace as the replay engine reads it: pointers turned into allocation ids, the events the
//! engine has no use for left out, and where live memory peaks.

use rustc_hash::FxHashMap;

use super::log::{self, Log, Start};

/// Parallel columns of engine events (action codes 0 alloc, 1 free, 2 segment_alloc,
/// 3 segment_free, 4 segment_map, 5 segment_unmap).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub actions: Vec<u64>,
    pub ids: Vec<u64>,
    pub sizes: Vec<u64>,
    pub streams: Vec<u64>,
    pub addrs: Vec<u64>,
    /// the log index of each engine event
    pub source: Vec<u64>,
    /// (id, address, requested, block size, stream) of the start state's live blocks
    pub start_blocks: Vec<(u32, u64, u64, u64, u64)>,
    pub peak_live: u64,
    /// the engine event after which live memory first reaches its peak (-1: the start)
    pub peak_event: i64,
}

/// Sums saturate (a hostile log's sizes cannot overflow them). Frees of pointers that are
/// not live are dropped; an allocation at a live pointer ends the old one (the log missed its
/// free): a free of the old id goes to the engine first, so that the models hold what the
/// trace holds. `keep_addr`: pass allocation addresses on (snapshots: the caching model
/// compares its own with them).
pub fn prepare(log: &Log, start: Option<&Start>, keep_addr: bool) -> Prepared {
    let mut p = Prepared {
        peak_event: -1,
        ..Prepared::default()
    };
    let mut live: FxHashMap<u64, (u32, u64)> = FxHashMap::default();
    let mut next_id: u32 = 0;
    let mut cur: u64 = 0;
    if let Some(s) = start {
        for &(addr, req, bsize, stream) in &s.blocks {
            live.insert(addr, (next_id, req));
            p.start_blocks.push((next_id, addr, req, bsize, stream));
            cur = cur.saturating_add(req);
            next_id = next_id.wrapping_add(1);
        }
    }
    let mut peak = cur;
    let n = log.len();
    for c in [
        &mut p.actions,
        &mut p.ids,
        &mut p.sizes,
        &mut p.streams,
        &mut p.addrs,
        &mut p.source,
    ] {
        c.reserve(n);
    }
    for i in 0..n {
        let (ptr, size) = (log.ptr[i], log.size[i]);
        let (code, ident) = match log.action[i] {
            log::ALLOC => {
                if let Some((old_id, old)) = live.remove(&ptr) {
                    cur = cur.saturating_sub(old);
                    p.actions.push(1);
                    p.ids.push(old_id as u64);
                    p.sizes.push(old);
                    p.streams.push(log.stream[i]);
                    p.addrs.push(0);
                    p.source.push(i as u64);
                }
                live.insert(ptr, (next_id, size));
                let id = next_id;
                next_id = next_id.wrapping_add(1);
                cur = cur.saturating_add(size);
                (0, id)
            }
            log::FREE => match live.remove(&ptr) {
                Some((id, s)) => {
                    cur = cur.saturating_sub(s);
                    (1, id)
                }
                None => continue,
            },
            log::SEGMENT_ALLOC => (2, 0),
            log::SEGMENT_FREE => (3, 0),
            log::SEGMENT_MAP => (4, 0),
            log::SEGMENT_UNMAP => (5, 0),
            _ => continue,
        };
        p.actions.push(code);
        p.ids.push(ident as u64);
        p.sizes.push(size);
        p.streams.push(log.stream[i]);
        p.addrs.push(if keep_addr || code >= 2 { ptr } else { 0 });
        p.source.push(i as u64);
        if cur > peak {
            peak = cur;
            p.peak_event = p.actions.len() as i64 - 1;
        }
    }
    p.peak_live = peak;
    p
}
