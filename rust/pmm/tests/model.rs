//! Model-based test: random operation streams against a shadow map of allocated ranges; and a
//! fixed-seed stress of allocations and frees.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        kernel: bool,
        size_idx: usize,
        count: usize,
    },
    Free {
        pick: usize,
    },
    Unpin {
        pick: usize,
    },
    Split {
        pick: usize,
    },
    Merge {
        pick: usize,
    },
    Mark {
        pick: usize,
        list: usize,
    },
    Evict,
    AllocEvict {
        size_idx: usize,
    },
    ReleaseRoots,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), 0..4usize, 1..4usize).prop_map(|(kernel, size_idx, count)| Op::Alloc { kernel, size_idx, count }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Unpin { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Split { pick }),
        1 => any::<usize>().prop_map(|pick| Op::Merge { pick }),
        1 => (any::<usize>(), 0..3usize).prop_map(|(pick, list)| Op::Mark { pick, list }),
        1 => Just(Op::Evict),
        1 => (0..3usize).prop_map(|size_idx| Op::AllocEvict { size_idx }),
        1 => Just(Op::ReleaseRoots),
    ]
}

/// The shadow: allocated leaf ranges by address. Any overlap is a failure.
struct Shadow {
    ranges: BTreeMap<u64, (u64, ChunkId)>,
    /// Split parents we may merge: parent -> its leaves.
    parents: Vec<(ChunkId, Vec<ChunkId>)>,
}

impl Shadow {
    fn insert(&mut self, p: &Pmm, id: ChunkId) {
        let i = p.info(id).unwrap();
        let end = i.addr + i.size;
        if let Some((&a, &(e, _))) = self.ranges.range(..end).next_back() {
            assert!(
                e <= i.addr || a >= end,
                "overlap: [{a:#x},{e:#x}) and [{:#x},{end:#x})",
                i.addr
            );
        }
        self.ranges.insert(i.addr, (end, id));
    }

    fn remove(&mut self, p: &Pmm, id: ChunkId) {
        let addr = p.info(id).unwrap().addr;
        assert_eq!(self.ranges.remove(&addr).map(|r| r.1), Some(id));
    }

    fn nth(&self, pick: usize) -> Option<ChunkId> {
        if self.ranges.is_empty() {
            return None;
        }
        self.ranges
            .values()
            .nth(pick % self.ranges.len())
            .map(|r| r.1)
    }
}

fn run_ops(maxwell_arch: bool, ops: Vec<Op>) {
    let cfg = if maxwell_arch {
        maxwell(8 * M)
    } else {
        turing(8 * M)
    };
    let mut p = Pmm::new(cfg).unwrap();
    let mut sh = Shadow {
        ranges: BTreeMap::new(),
        parents: Vec::new(),
    };
    for op in ops {
        match op {
            Op::Alloc {
                kernel,
                size_idx,
                count,
            } => {
                let t = if kernel {
                    ChunkType::Kernel
                } else {
                    ChunkType::User
                };
                let sizes = p.size_mask(t).sizes();
                let size = sizes[size_idx % sizes.len()];
                if let Ok(ids) = p.alloc_chunks(count, size, t, false) {
                    for id in ids {
                        sh.insert(&p, id);
                    }
                }
            }
            Op::AllocEvict { size_idx } => {
                let sizes = p.size_mask(ChunkType::User).sizes();
                let size = sizes[size_idx % sizes.len()];
                let before: Vec<_> = sh.ranges.values().map(|r| r.1).collect();
                if let Ok(id) = p.alloc_chunk(size, ChunkType::User, true) {
                    let evicted = p.take_evicted();
                    for e in &evicted {
                        assert_eq!(sh.ranges.remove(&e.addr).map(|r| r.1), Some(e.id));
                    }
                    sh.parents.retain(|(parent, _)| p.info(*parent).is_ok());
                    sh.insert(&p, id);
                    for b in before {
                        if !evicted.iter().any(|e| e.id == b) {
                            assert!(p.info(b).is_ok(), "a chunk that was not evicted vanished");
                        }
                    }
                }
            }
            Op::Free { pick } => {
                if let Some(id) = sh.nth(pick) {
                    sh.remove(&p, id);
                    p.free(id).unwrap();
                    sh.parents.retain(|(_, kids)| !kids.contains(&id));
                    assert!(p.free(id).is_err(), "double free must be refused");
                }
            }
            Op::Unpin { pick } => {
                if let Some(id) = sh.nth(pick) {
                    let pinned = p.info(id).unwrap().state == ChunkState::TempPinned;
                    assert_eq!(p.unpin(id).is_ok(), pinned);
                }
            }
            Op::Split { pick } => {
                if let Some(id) = sh.nth(pick) {
                    if let Ok(kids) = p.split(id, None) {
                        sh.ranges.remove(&p.info(id).unwrap().addr);
                        for &k in &kids {
                            sh.insert(&p, k);
                        }
                        sh.parents.push((id, kids));
                    }
                }
            }
            Op::Merge { pick } => {
                if !sh.parents.is_empty() {
                    let (parent, kids) = sh.parents[pick % sh.parents.len()].clone();
                    if p.merge(parent).is_ok() {
                        for k in &kids {
                            sh.ranges.retain(|_, r| r.1 != *k);
                        }
                        sh.insert(&p, parent);
                        sh.parents.retain(|(q, _)| *q != parent);
                    }
                }
            }
            Op::Mark { pick, list } => {
                if let Some(id) = sh.nth(pick) {
                    let _ = p.mark_root(id, RootList::ALL[list]);
                }
            }
            Op::Evict => {
                if let Ok(ev) = p.evict_root() {
                    for c in ev.chunks {
                        assert_eq!(sh.ranges.remove(&c.addr).map(|r| r.1), Some(c.id));
                    }
                    sh.parents.retain(|(parent, _)| p.info(*parent).is_ok());
                }
            }
            Op::ReleaseRoots => {
                p.release_free_roots();
            }
        }
        // check=true validated inside the PMM; the shadow agrees on the allocated bytes.
        let bytes: u64 = sh.ranges.iter().map(|(a, (e, _))| e - a).sum();
        assert_eq!(p.stats().allocated_bytes, bytes);
    }
    // Free everything left: no chunk leaks, all roots back.
    let left: Vec<_> = sh.ranges.values().map(|r| r.1).collect();
    for id in left {
        p.free(id).unwrap();
    }
    assert_all_free(&p);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_streams_match_the_shadow_model(ops in prop::collection::vec(op(), 1..160)) {
        run_ops(false, ops);
    }

    #[test]
    fn random_streams_on_maxwell(ops in prop::collection::vec(op(), 1..120)) {
        run_ops(true, ops);
    }
}

#[test]
fn fixed_seed_stress() {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let mut cfg = turing(64 * M);
    cfg.check = false;
    let mut p = Pmm::new(cfg).unwrap();
    let mut rng = StdRng::seed_from_u64(0x6770_756d);
    let mut live: Vec<ChunkId> = Vec::new();
    for step in 0..200_000u32 {
        if rng.gen_bool(0.55) || live.is_empty() {
            let t = if rng.gen_bool(0.8) {
                ChunkType::User
            } else {
                ChunkType::Kernel
            };
            let sizes = p.size_mask(t).sizes();
            let size = sizes[rng.gen_range(0..sizes.len())];
            if let Ok(id) = p.alloc_chunk(size, t, false) {
                live.push(id);
            }
        } else {
            let id = live.swap_remove(rng.gen_range(0..live.len()));
            p.free(id).unwrap();
        }
        if step % 20_000 == 0 {
            p.validate().unwrap();
        }
    }
    for id in live {
        p.free(id).unwrap();
    }
    assert_all_free(&p);
}
