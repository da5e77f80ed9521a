//! PMM tests: the driver's own test patterns (uvm_pmm_test.c: size sweeps, exhaustion, free
//! orders, split/merge), every illegal operation, eviction order, and a model-based proptest
//! against a shadow map of allocated ranges, a file a topic (below). This file holds the
//! configurations and the checks they share.

mod exhaustion; // every chunk of a device taken, then freed in every order
mod free_roots; // which free chunk or root an allocation takes, and free roots given back
mod lru_eviction; // root lists, eviction order, allocations that may evict
mod model; // random operation streams against a shadow map, and a fixed-seed stress
mod refusals; // every illegal operation is refused and changes nothing; batches all or nothing
mod sizes; // size masks, device sizes, new chunks of every type and size, size sweeps
mod split_merge; // lazy one-level splits, eager merges, explicit split and merge

use super::*;

const K: u64 = 1024;
const M: u64 = 1024 * 1024;

fn turing(vidmem: u64) -> PmmConfig {
    let mut c = PmmConfig::new(
        vidmem,
        SizeMask::from_sizes(&[4 * K, 64 * K, 2 * M]).unwrap(),
        SizeMask::from_sizes(&[256, 4 * K, 64 * K, 2 * M]).unwrap(),
    );
    c.check = true;
    c
}

fn maxwell(vidmem: u64) -> PmmConfig {
    let mut c = turing(vidmem);
    c.user_sizes = SizeMask::from_sizes(&[4 * K, 64 * K, 128 * K, 2 * M]).unwrap();
    c
}

fn pmm(vidmem: u64) -> Pmm {
    Pmm::new(turing(vidmem)).unwrap()
}

/// After everything is freed: every root is device-owned or free, and no chunk leaks.
fn assert_all_free(p: &Pmm) {
    p.validate().unwrap();
    let s = p.stats();
    assert_eq!(s.allocated_bytes, 0);
    assert_eq!(s.roots_pma_owned + s.roots_free, s.num_roots);
    assert_eq!(s.free_bytes, s.roots_free * ROOT_CHUNK_SIZE);
    assert!(p.allocated_chunks().is_empty());
}

fn all_types_and_sizes(p: &Pmm) -> Vec<(ChunkType, u64)> {
    ChunkType::ALL
        .iter()
        .flat_map(|&t| p.size_mask(t).sizes().into_iter().map(move |s| (t, s)))
        .collect()
}
