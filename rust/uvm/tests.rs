use super::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn uvm(vidmem: u64) -> Uvm {
    let mut cfg = UvmConfig::new(vidmem, Costs::new(3.35e12, 63e9));
    cfg.check = true; // every invariant after every fault batch
    Uvm::new(cfg).unwrap()
}

fn gpu(range: u32, pattern: Pattern) -> Kernel {
    Kernel {
        processor: Processor::Gpu,
        range,
        pattern,
        write: false,
    }
}

/// A kernel on `processor` streaming through `range`, writing or only reading.
fn stream(processor: Processor, range: u32, write: bool) -> Kernel {
    Kernel {
        processor,
        range,
        pattern: Pattern::Streaming,
        write,
    }
}

#[test]
fn first_touch_on_gpu_copies_nothing() {
    let mut u = uvm(64 * MIB);
    let r = u.alloc_managed(16 * MIB).unwrap();
    let s = u.run_kernel(&gpu(r, Pattern::Streaming)).unwrap();
    assert_eq!(s.accesses, 4096);
    assert_eq!(s.bytes_h2d, 0);
    assert_eq!(u.resident(), (16 * MIB, 0));
    assert_eq!(u.vidmem_used(), 16 * MIB);
    u.validate().unwrap();
    // a second pass is all hits
    let s = u.run_kernel(&gpu(r, Pattern::Streaming)).unwrap();
    assert_eq!((s.faults, s.hbm_bytes), (0, 16 * MIB));
}

#[test]
fn prefetch_cuts_streaming_faults() {
    let run = |prefetch| {
        let mut cfg = UvmConfig::new(GIB, Costs::new(3.35e12, 63e9));
        cfg.prefetch = prefetch;
        let mut u = Uvm::new(cfg).unwrap();
        let r = u.alloc_managed(256 * MIB).unwrap();
        u.run_kernel(&stream(Processor::Cpu, r, true)).unwrap();
        let s = u.run_kernel(&gpu(r, Pattern::Streaming)).unwrap();
        u.validate().unwrap();
        assert_eq!(s.bytes_h2d, 256 * MIB);
        s
    };
    let with = run(true);
    let without = run(false);
    assert!(with.prefetched_pages > 0);
    assert!(
        without.faults >= 10 * with.faults,
        "{} vs {}",
        without.faults,
        with.faults
    );
    assert!(with.time_ns < without.time_ns);
}

#[test]
fn oversubscription_evicts_in_lru_order() {
    let mut u = uvm(64 * MIB);
    let r = u.alloc_managed(96 * MIB).unwrap();
    let s = u.run_kernel(&gpu(r, Pattern::Streaming)).unwrap();
    assert_eq!(s.evictions, 16);
    assert_eq!(u.vidmem_used(), 64 * MIB);
    let (g, c) = u.resident();
    assert_eq!((g, c), (64 * MIB, 32 * MIB));
    assert_eq!(s.bytes_d2h, 32 * MIB);
    u.validate().unwrap();
    // the first 32 MiB (least recently used) went to the CPU
    let again = u
        .run_kernel(&gpu(r, Pattern::Explicit((0..8192).collect())))
        .unwrap();
    assert!(again.faults > 0 && again.evictions == 16);
    u.validate().unwrap();
}

#[test]
fn random_access_under_oversubscription_is_slow() {
    let time = |factor: f64| {
        let mut u = uvm(256 * MIB);
        let size = (256.0 * factor) as u64 * MIB;
        let r = u.alloc_managed(size).unwrap();
        u.run_kernel(&gpu(r, Pattern::Streaming)).unwrap();
        let touches = size / PAGE;
        let s = u
            .run_kernel(&gpu(r, Pattern::RandomWarp { touches }))
            .unwrap();
        u.validate().unwrap();
        s.time_ns / size as f64
    };
    let fits = time(0.9);
    let over = time(1.25);
    assert!(over > 20.0 * fits, "{over} vs {fits} ns per byte");
}

#[test]
fn pinning_stops_ping_pong() {
    let mut u = uvm(64 * MIB);
    let r = u.alloc_managed(64 * 1024).unwrap();
    let page = Pattern::Explicit(vec![0]);
    let cpu = Kernel {
        processor: Processor::Cpu,
        range: r,
        pattern: page.clone(),
        write: true,
    };
    let mut tail = Stats::default();
    for round in 0..40 {
        let a = u.run_kernel(&cpu).unwrap();
        let b = u.run_kernel(&gpu(r, page.clone())).unwrap();
        if round >= 35 {
            tail.add(&a);
            tail.add(&b);
        }
    }
    assert!(u.total.thrashing_pages >= 1 && u.total.throttles > 0 && u.total.pins >= 1);
    // once pinned, nothing migrates: one side reads the page in place over the link
    assert_eq!(tail.bytes_h2d + tail.bytes_d2h, 0);
    assert!(tail.remote_bytes > 0);
    u.validate().unwrap();
}

#[test]
fn read_mostly_duplicates() {
    let mut u = uvm(64 * MIB);
    let r = u.alloc_managed(4 * MIB).unwrap();
    u.advise(r, Advice::ReadMostly).unwrap();
    u.run_kernel(&stream(Processor::Cpu, r, true)).unwrap();
    u.run_kernel(&gpu(r, Pattern::Streaming)).unwrap();
    assert_eq!(u.resident(), (4 * MIB, 4 * MIB));
    let s = u.run_kernel(&stream(Processor::Cpu, r, false)).unwrap();
    assert_eq!((s.cpu_faults, s.bytes_d2h), (0, 0));
    // a GPU write collapses the copies
    u.run_kernel(&stream(Processor::Gpu, r, true)).unwrap();
    assert_eq!(u.resident(), (4 * MIB, 0));
    u.validate().unwrap();
}

#[test]
fn zero_copy_never_migrates() {
    let mut u = uvm(64 * MIB);
    let r = u.alloc_managed(128 * MIB).unwrap();
    u.advise(r, Advice::ZeroCopy).unwrap();
    let s = u
        .run_kernel(&gpu(r, Pattern::RandomWarp { touches: 50_000 }))
        .unwrap();
    assert_eq!((s.faults, s.bytes_h2d, s.evictions), (0, 0, 0));
    assert_eq!(s.remote_bytes, 50_000 * PAGE);
    assert_eq!(u.vidmem_used(), 0);
}

#[test]
fn stripe_and_prefetch_hints() {
    let mut u = uvm(64 * MIB);
    let r = u.alloc_managed(128 * MIB).unwrap();
    u.stripe(r, 0.5).unwrap();
    assert_eq!(u.vidmem_used(), 64 * MIB);
    let s = u.run_kernel(&gpu(r, Pattern::Streaming)).unwrap();
    assert_eq!(
        (s.faults, s.remote_bytes, s.hbm_bytes),
        (0, 64 * MIB, 64 * MIB)
    );
    let mut u = uvm(64 * MIB);
    let r = u.alloc_managed(32 * MIB).unwrap();
    u.prefetch(r, Processor::Gpu).unwrap();
    let s = u.run_kernel(&gpu(r, Pattern::Streaming)).unwrap();
    assert_eq!(s.faults, 0);
    u.validate().unwrap();
}

#[test]
fn deterministic_for_a_seed() {
    let run = || {
        let mut u = uvm(64 * MIB);
        let r = u.alloc_managed(96 * MIB).unwrap();
        u.run_kernel(&gpu(r, Pattern::RandomWarp { touches: 30_000 }))
            .unwrap()
    };
    assert_eq!(run(), run());
}

#[test]
fn bad_input() {
    let mut u = uvm(64 * MIB);
    assert!(u.alloc_managed(0).is_err());
    assert!(u.advise(7, Advice::ReadMostly).is_err());
    let r = u.alloc_managed(PAGE).unwrap();
    assert!(u.run_kernel(&gpu(r, Pattern::Explicit(vec![1]))).is_err());
    assert!(Uvm::new(UvmConfig::new(MIB, Costs::new(1e12, 1e10))).is_err());
}
