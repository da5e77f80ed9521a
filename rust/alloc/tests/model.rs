//! Model-based: random streams of operations (`Op`, in `mod.rs`) against a shadow map of live
//! ranges.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// What a refused request (no movable allocation to compact) leaves: the pool as it was
/// (`before`), or, if the size cache held `cached` allocations, the same allocations and
/// counters with the cache given back (out of memory releases what is cached first).
fn refused_changes_nothing(
    p: &Pool,
    before: &(PoolStats, Vec<PageSnapshot>),
    cached: u64,
    live: &[(u64, u64)],
) -> std::result::Result<(), TestCaseError> {
    if cached == 0 {
        prop_assert_eq!(before, &(unchanging(p), p.page_snapshot()));
    } else {
        let (s, t) = (&before.0, unchanging(p));
        prop_assert_eq!(t.cached_allocs, 0);
        let key = |s: &PoolStats| {
            (
                s.live_bytes,
                s.used_bytes,
                s.reserved_bytes,
                s.peak_reserved,
                s.allocs,
                s.frees,
            )
        };
        prop_assert_eq!(key(s), key(&t));
        prop_assert_eq!(live, &ranges(p)[..]);
    }
    Ok(())
}

/// (pointer, rounded size) of every live or freeing allocation.
fn ranges(p: &Pool) -> Vec<(u64, u64)> {
    p.allocations().iter().map(|x| (x.ptr, x.rounded)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn random_streams_keep_every_invariant(
        ops in proptest::collection::vec(op(), 1..120),
        threshold in any::<bool>(),
    ) {
        let mut p = stream_pool(threshold);
        let mut live: Vec<AllocId> = vec![];
        let mut fences: Vec<u64> = vec![];
        // the members of each batch made (found without a lookup by pointer, which would
        // index them: `free_batch` of a whole batch is then served from its record)
        let mut batches: Vec<Vec<AllocId>> = vec![];
        for op in ops {
            // a refused request leaves the pool as it was (but for counting the failure),
            // unless it had movable allocations to compact on the way
            let before = (unchanging(&p), p.page_snapshot());
            let (cached, held) = (before.0.cached_allocs, ranges(&p));
            let fixed = p.allocations().iter().all(|x| !x.movable);
            match op {
                Op::Alloc(size, stream, movable) => {
                    match p.alloc(Request { size, stream, movable, scope: 0 }) {
                        Ok((id, _)) => live.push(id),
                        Err(Error::OutOfMemory(_)) => if fixed {
                            refused_changes_nothing(&p, &before, cached, &held)?;
                        },
                        Err(e) => panic!("{e:?}"),
                    }
                }
                Op::Batch(sizes) => {
                    let mut out = vec![];
                    match p.alloc_batch(&sizes, 0, &mut out) {
                        Ok(()) => {
                            let ids = ids_of(&p, &out);
                            live.extend(&ids);
                            batches.push(ids);
                        }
                        Err(Error::OutOfMemory(_)) => if fixed {
                            prop_assert!(out.is_empty());
                            refused_changes_nothing(&p, &before, cached, &held)?;
                        },
                        Err(e) => panic!("{e:?}"),
                    }
                }
                Op::Arena(sizes, stream) => {
                    let mut out = vec![];
                    match p.alloc_arena(&sizes, stream, &mut out) {
                        Ok(()) => {
                            let ids = ids_of(&p, &out);
                            live.extend(&ids);
                            batches.push(ids);
                        }
                        Err(Error::OutOfMemory(_) | Error::InvalidSize(_)) => {
                            prop_assert!(out.is_empty())
                        }
                        Err(e) => panic!("{e:?}"),
                    }
                }
                Op::FreeBatch(i, n) if !live.is_empty() => {
                    // up to n allocations from position i on, freed together by pointer
                    let ptrs = drain_ptrs(&p, &mut live, i, n);
                    p.free_batch(&ptrs).unwrap();
                }
                Op::FreeLastBatch => {
                    while let Some(ids) = batches.pop() {
                        if ids.iter().all(|id| live.contains(id)) {
                            let ptrs: Vec<u64> = ids.iter().map(|&id| p.info(id).unwrap().ptr).collect();
                            p.free_batch(&ptrs).unwrap();
                            live.retain(|id| !ids.contains(id));
                            break;
                        }
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let id = live.swap_remove(i % live.len());
                    p.free(id).unwrap();
                }
                Op::FreePtr(i) if !live.is_empty() => {
                    let id = live.swap_remove(i % live.len());
                    let ptr = p.info(id).unwrap().ptr;
                    p.free_ptr(ptr).unwrap();
                }
                Op::FreeAsync(i, s) if !live.is_empty() => {
                    let id = live.swap_remove(i % live.len());
                    fences.push(p.free_async(id, s).unwrap());
                }
                Op::Complete(i) if !fences.is_empty() => {
                    p.complete(fences[i % fences.len()]).unwrap();
                }
                Op::Sync => { p.synchronize(None).unwrap(); }
                Op::Defrag => { p.defrag().unwrap(); }
                Op::Trim => { p.trim(4 * MIB).unwrap(); }
                _ => {}
            }
            // the shadow: live and freeing ranges never overlap, in virtual or physical space
            let mut ranges = BTreeMap::new();
            for x in p.allocations() {
                ranges.insert(x.ptr, x.rounded);
            }
            let mut end = 0;
            for (&start, &len) in &ranges {
                prop_assert!(start >= end, "overlap at {start:#x}");
                end = start + len;
            }
            for id in &live {
                prop_assert!(p.info(*id).is_ok());
            }
        }
        p.synchronize(None).unwrap();
        for id in live {
            p.free(id).unwrap();
        }
        let s = p.stats();
        prop_assert_eq!(s.used_bytes, 0);
        prop_assert_eq!(s.pages_heap + s.pages_large + s.pages_full, 0);
        p.validate().unwrap();
    }
}
