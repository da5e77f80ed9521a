//! gpumm against the allocators people would pick instead, on the same operation streams, in
//! one criterion run (issue 7). Peers are dev-dependencies only:
//! - `offset-allocator`: the Rust port of sebbbi's OffsetAllocator (O(1) bins, 32-bit offsets);
//!   it manages offsets in units; here 256 B units, like gpumm's granules.
//! - `rlsf`: TLSF with its metadata in band, so it needs real memory: it manages a 16 GiB
//!   anonymous mapping (MAP_NORESERVE; only block headers are ever touched).
//!
//! Streams: `churn` (2048 live allocations of log-uniform sizes 256 B – 64 MiB; each step frees
//! a random one of the churning half and allocates a new size: one alloc + free pair; another
//! live count with `GPUMM_CHURN_LIVE`),
//! `fixed-1KiB` and `fixed-64KiB` (a pair of that size on a warm allocator), and
//! `trace-<name>`: the events of each real RMM-log trace in `../shared/traces/` (training
//! steps of gpt2, bert, resnet50), replayed whole and what is left live freed, one iteration a
//! replay, timed per operation (every allocation and every free); skipped, with a note, where
//! that folder is absent. gpumm runs on an 80 GiB simulated device, as the default pool
//! (taking pages as it needs them) and as `gpumm-80G`, a pool that reserves the whole device
//! up front, as the peers manage the whole 80 GiB from the start. Its PMM (`gpumm-pmm`) runs
//! the 64 KiB stream, one of its chunk sizes: it serves chunk sizes only, so the streams of
//! other sizes go through the pool, which takes its pages from it.
//! `python benches/compare.py` prints the ratios.

#![allow(unsafe_code)]

#[path = "common/mod.rs"]
mod common;

use std::alloc::Layout;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

use _core::alloc::Pool;
use _core::pmm::{ChunkId, ChunkType, Pmm};
use common::{Peer, G, K, M};

/// gpumm's pool on an 80 GiB simulated device, reserving `initial` bytes when made.
fn gpumm(initial: u64) -> Pool {
    common::pool(80 * G, 2 * M, initial)
}

struct Offset(offset_allocator::Allocator);

impl Peer for Offset {
    type H = offset_allocator::Allocation;
    fn alloc(&mut self, size: u64) -> Option<Self::H> {
        self.0.allocate(size.div_ceil(256) as u32)
    }
    fn free(&mut self, h: Self::H) {
        self.0.free(h);
    }
}

type RTlsf = rlsf::Tlsf<'static, u32, u32, 30, 32>;

struct Rlsf(RTlsf);

impl Rlsf {
    fn new() -> Self {
        let len = 16 * G as usize;
        // SAFETY: a fresh private anonymous mapping that nothing else uses; it lives for the
        // rest of the process (leaked on purpose: the allocator borrows it for 'static).
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        // SAFETY: the mapping is valid for `len` bytes and handed to the allocator only.
        let pool: &'static mut [MaybeUninit<u8>] =
            unsafe { std::slice::from_raw_parts_mut(base as *mut MaybeUninit<u8>, len) };
        let mut t = RTlsf::new();
        t.insert_free_block(pool);
        Rlsf(t)
    }
}

impl Peer for Rlsf {
    type H = NonNull<u8>;
    fn alloc(&mut self, size: u64) -> Option<NonNull<u8>> {
        self.0
            .allocate(Layout::from_size_align(size as usize, 256).unwrap())
    }
    fn free(&mut self, h: NonNull<u8>) {
        // SAFETY: `h` came from `allocate` of this allocator with alignment 256, freed once.
        unsafe { self.0.deallocate(h, 256) };
    }
}

/// The churn stream's live allocations: 2,048, or `GPUMM_CHURN_LIVE` (then the group is
/// `peers-churn-live<N>`, apart from the standard one that `compare.py` reads). The ratio
/// depends on it: an allocation's metadata is a 64-byte slot and a 32-byte block in gpumm,
/// a 28-byte node in offset-allocator, so their hot sets outgrow the L1 cache at different
/// sizes (benches/RESULTS.md, "The churn by live-set size").
fn churn_live() -> usize {
    match std::env::var("GPUMM_CHURN_LIVE") {
        Err(_) => 2048,
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n >= 2 => n,
            _ => panic!("GPUMM_CHURN_LIVE={v:?}: a number of live allocations, at least 2"),
        },
    }
}

fn churn<P: Peer>(c: &mut Criterion, name: &str, mut p: P) {
    let live = churn_live();
    let group = match live {
        2048 => "peers-churn".to_string(),
        n => format!("peers-churn-live{n}"),
    };
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(1));
    common::churn(&mut g, name, &mut p, live, (8.0, 26.0));
    g.finish();
}

/// gpumm's PMM as an allocator of 64 KiB user chunks (a size it serves: its user chunks are
/// 4 KiB, 64 KiB and 2 MiB; a stream of any other size goes through the pool, which takes its
/// pages from the PMM).
struct PmmChunks(Pmm);

impl Peer for PmmChunks {
    type H = ChunkId;
    fn alloc(&mut self, size: u64) -> Option<ChunkId> {
        self.0.alloc_chunk(size, ChunkType::User, false).ok()
    }
    fn free(&mut self, h: ChunkId) {
        self.0.free(h).unwrap();
    }
}

/// A pair of `size` on a warm allocator (70 of that size stay live), as `name` of group
/// `peers-fixed-<label>`.
fn fixed<P: Peer>(c: &mut Criterion, (size, label): (u64, &str), name: &str, mut p: P) {
    let mut g = c.benchmark_group(format!("peers-fixed-{label}"));
    g.throughput(Throughput::Elements(1));
    let _keep: Vec<P::H> = (0..70).map(|_| p.alloc(size).unwrap()).collect();
    g.bench_function(name, |b| {
        b.iter(|| {
            let h = p.alloc(black_box(size)).unwrap();
            p.free(h);
        })
    });
    g.finish();
}

/// One event of a trace: allocate `size` bytes as allocation `key`, or free allocation `key`.
#[derive(Copy, Clone)]
enum Ev {
    Alloc(u32, u64),
    Free(u32),
}

/// The events of an RMM log (`Thread,Time,Action,Pointer,Size,Stream`, gzipped), pointers
/// renamed to dense keys (a pointer reused after its free is a new key); a free of a pointer
/// the log never allocated is left out. Returns the events and the number of keys.
fn read_rmm_log(path: &std::path::Path) -> (Vec<Ev>, usize) {
    let file = std::fs::File::open(path).expect("a readable trace");
    let lines = BufReader::new(flate2::read::GzDecoder::new(file)).lines();
    let (mut events, mut keys, mut next) = (vec![], HashMap::new(), 0u32);
    for line in lines.skip(1) {
        let line = line.expect("a gzipped text trace");
        let f: Vec<&str> = line.split(',').collect();
        let ptr = u64::from_str_radix(f[3].trim_start_matches("0x"), 16).expect("a pointer");
        match f[2] {
            "allocate" => {
                keys.insert(ptr, next);
                events.push(Ev::Alloc(next, f[4].parse().expect("a size")));
                next += 1;
            }
            "free" => {
                if let Some(k) = keys.remove(&ptr) {
                    events.push(Ev::Free(k));
                }
            }
            _ => {}
        }
    }
    (events, next as usize)
}

fn trace<P: Peer>(
    c: &mut Criterion,
    group: &str,
    name: &str,
    events: &[Ev],
    keys: usize,
    mut p: P,
) {
    let mut g = c.benchmark_group(group);
    let allocs = events.iter().filter(|e| matches!(e, Ev::Alloc(..))).count();
    g.throughput(Throughput::Elements(2 * allocs as u64));
    let mut live: Vec<Option<P::H>> = vec![None; keys];
    g.bench_function(name, |b| {
        b.iter(|| {
            for &e in events {
                match e {
                    Ev::Alloc(k, size) => {
                        live[k as usize] = Some(p.alloc(black_box(size)).expect("fits"))
                    }
                    Ev::Free(k) => p.free(live[k as usize].take().expect("live")),
                }
            }
            for h in live.iter_mut().filter_map(Option::take) {
                p.free(h);
            }
        })
    });
    g.finish();
}

/// The RMM-log traces in ../shared/traces, beside the project's folder.
fn traces() -> Vec<(String, Vec<Ev>, usize)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
    let mut out = vec![];
    for name in ["gpt2_train", "bert_train", "resnet50_train"] {
        let path = dir.join(format!("{name}.csv.gz"));
        if !path.exists() {
            eprintln!(
                "{}: absent (a user's own clone): trace streams skipped",
                path.display()
            );
            return vec![];
        }
        let (events, keys) = read_rmm_log(&path);
        out.push((name.to_string(), events, keys));
    }
    out
}

fn benches(c: &mut Criterion) {
    churn(c, "gpumm", gpumm(0));
    churn(c, "gpumm-80G", gpumm(80 * G));
    churn(
        c,
        "offset-allocator",
        Offset(offset_allocator::Allocator::new((80 * G / 256) as u32)),
    );
    churn(c, "rlsf", Rlsf::new());
    let offset = || Offset(offset_allocator::Allocator::new((80 * G / 256) as u32));
    for size in [(1024, "1KiB"), (64 * K, "64KiB")] {
        fixed(c, size, "gpumm", gpumm(0));
        if size.0 == 64 * K {
            fixed(c, size, "gpumm-pmm", PmmChunks(common::hopper(80 * G)));
        }
        fixed(c, size, "offset-allocator", offset());
        fixed(c, size, "rlsf", Rlsf::new());
    }
    for (name, events, keys) in traces() {
        let group = format!("peers-trace-{name}");
        trace(c, &group, "gpumm", &events, keys, gpumm(0));
        trace(c, &group, "offset-allocator", &events, keys, offset());
        trace(c, &group, "rlsf", &events, keys, Rlsf::new());
    }
}

criterion_group!(peers, benches);
criterion_main!(peers);
