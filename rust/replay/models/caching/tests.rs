//! The caching model's garbage collection and per-interval rounding, on hand-made streams.

use super::Caching;
use crate::replay::models::{CachingOptions, MIB};
use crate::replay::Model;

const GIB: u64 = 1 << 30;

fn with_gc(threshold: f64) -> Caching {
    Caching::new(
        GIB,
        CachingOptions {
            garbage_collection_threshold: threshold,
            ..CachingOptions::default()
        },
    )
}

fn segments(m: &Caching) -> Vec<(u64, u64)> {
    m.b.segments.iter().map(|(&a, s)| (a, s.size)).collect()
}

/// Two old free 100 MiB segments, two young free 120 MiB ones, a 130 MiB one in use; a
/// 30 MiB block freed and taken again ten times ages the old ones. Returns the model and
/// the addresses of the old and the young segments.
fn aged(threshold: f64) -> (Caching, Vec<u64>, Vec<u64>) {
    let mut m = with_gc(threshold);
    let old: Vec<u64> = (0..2).filter_map(|i| m.alloc(i, 100 * MIB, 0)).collect();
    let mut x = 10;
    m.alloc(x, 30 * MIB, 0);
    m.free(0);
    m.free(1);
    for _ in 0..10 {
        m.free(x);
        x += 1;
        m.alloc(x, 30 * MIB, 0);
    }
    // larger than the old ones, so they take new segments
    let young: Vec<u64> = (20..22).filter_map(|i| m.alloc(i, 120 * MIB, 0)).collect();
    m.free(20);
    m.free(21);
    assert_eq!(m.reserved(), 470 * MIB);
    // 470 MiB is under half the device: no collection; a new 130 MiB segment
    assert!(m.alloc(30, 130 * MIB, 0).is_some());
    assert_eq!(m.reserved(), 600 * MIB, "no collection under the threshold");
    (m, old, young)
}

#[test]
fn the_collection_frees_the_old_segments_and_keeps_the_young() {
    let (mut m, old, young) = aged(0.5);
    // 600 MiB > 512 MiB: before a new 140 MiB segment, 88 MiB must go. Ages: the old ones
    // 14 requests, the young ones 2; the average is 8, so both old ones go (200 MiB) and
    // the young ones stay.
    assert!(m.alloc(31, 140 * MIB, 0).is_some());
    assert_eq!(m.reserved(), (600 - 200 + 140) * MIB);
    let segs = segments(&m);
    for a in &old {
        assert!(!segs.iter().any(|s| s.0 == *a), "old segment {a:#x} kept");
    }
    for a in &young {
        assert!(
            segs.contains(&(*a, 120 * MIB)),
            "young segment {a:#x} freed"
        );
    }
    m.validate().unwrap();
}

#[test]
fn no_collection_below_the_threshold() {
    let (mut m, old, young) = aged(0.9);
    // 600 MiB < 0.9 GiB: every cached segment stays
    assert!(m.alloc(31, 140 * MIB, 0).is_some());
    assert_eq!(m.reserved(), 740 * MIB);
    let segs = segments(&m);
    assert!(old
        .iter()
        .chain(&young)
        .all(|a| segs.iter().any(|s| s.0 == *a)));
    // and none at all with the option off
    let mut off = Caching::new(GIB, CachingOptions::default());
    let ids: Vec<u32> = (0..6).collect();
    for &i in &ids {
        off.alloc(i, 120 * MIB, 0);
    }
    for &i in &ids[..5] {
        off.free(i);
    }
    off.alloc(9, 130 * MIB, 0);
    assert_eq!(off.reserved(), 850 * MIB);
}

#[test]
fn a_segment_in_use_in_part_is_never_collected() {
    let mut m = with_gc(0.1);
    // a 120 MiB segment split: 100 MiB live, 20 MiB free; and an old whole free one
    m.alloc(0, 120 * MIB, 0);
    m.free(0);
    m.alloc(1, 100 * MIB, 0); // takes the 120 MiB segment, the 20 MiB rest stays free
    m.alloc(2, 60 * MIB, 0);
    m.free(2);
    // 180 MiB > 102.4 MiB: the whole free 60 MiB segment goes; the split one stays
    m.alloc(3, 200 * MIB, 0);
    assert_eq!(m.reserved(), (120 + 200) * MIB);
    m.validate().unwrap();
}

#[test]
fn the_memory_fraction_caps_what_the_model_may_hold() {
    let mut m = Caching::new(
        GIB,
        CachingOptions {
            memory_fraction: 0.25,
            ..CachingOptions::default()
        },
    );
    assert!(m.alloc(0, 200 * MIB, 0).is_some());
    assert!(m.alloc(1, 60 * MIB, 0).is_none(), "past 256 MiB allowed");
    assert!(m.alloc(2, 56 * MIB, 0).is_some());
}

fn intervals(pairs: &[(usize, u64)]) -> Caching {
    let mut t = [0u64; 16];
    for &(i, d) in pairs {
        t[i] = d;
    }
    Caching::new(
        GIB,
        CachingOptions {
            divisions_by_interval: Some(t),
            ..CachingOptions::default()
        },
    )
}

#[test]
fn per_interval_rounding_at_each_edge() {
    // [256:1,512:2,1024:4,>:8]: intervals 0-8 take 1, 9 (512 MiB) 2, 10 (1 GiB) 4, 11-15 8
    let mut pairs: Vec<(usize, u64)> = (0..9).map(|i| (i, 1)).collect();
    pairs.extend([(9, 2), (10, 4)]);
    pairs.extend((11..16).map(|i| (i, 8)));
    let c = intervals(&pairs);
    assert_eq!(c.round_size(256 * MIB + 1), 256 * MIB + 512); // 1 division: 512 B steps
    assert_eq!(c.round_size(512 * MIB - 1), 512 * MIB);
    assert_eq!(c.round_size(512 * MIB + 1), 768 * MIB); // 2 divisions of [512 MiB, 1 GiB)
    assert_eq!(c.round_size(GIB - 1), GIB);
    assert_eq!(c.round_size(GIB + 1), GIB + 256 * MIB); // 4 divisions
    assert_eq!(c.round_size(2 * GIB - 1), 2 * GIB);
    assert_eq!(c.round_size(2 * GIB + 1), 2 * GIB + 256 * MIB); // 8 divisions
    assert_eq!(c.round_size(GIB), GIB); // a power of two stays
                                        // the last interval holds 32 GiB and everything above, 64 GiB and up included
    assert_eq!(c.round_size(32 * GIB + 1), 36 * GIB);
    assert_eq!(c.round_size(64 * GIB + 1), 72 * GIB);
    assert_eq!(c.round_size(100 * GIB), 104 * GIB);
}

#[test]
fn per_interval_rounding_below_two_mib_and_at_64_mib() {
    // interval 0 holds every size under 2 MiB; 5 is [32, 64) MiB, 6 is [64, 128) MiB
    let c = intervals(&[(0, 4), (1, 2), (5, 2), (6, 8)]);
    assert_eq!(c.round_size(1200), 1536); // at most 512 B x 4: 512 B steps
    assert_eq!(c.round_size(3000), 3072); // [2048, 4096) in 4 steps
    assert_eq!(c.round_size(2 * MIB - 1), 2 * MIB);
    assert_eq!(c.round_size(2 * MIB + 1), 3 * MIB); // interval 1: 2 divisions
    assert_eq!(c.round_size(4 * MIB + 1), 4 * MIB + 512); // interval 2 keeps 0
    assert_eq!(c.round_size(64 * MIB - 1), 64 * MIB); // interval 5: 2 steps of 16 MiB
    assert_eq!(c.round_size(48 * MIB + 1), 64 * MIB);
    assert_eq!(c.round_size(64 * MIB + 1), 72 * MIB); // interval 6: 8 MiB steps
    assert_eq!(c.round_size(128 * MIB + 1), 128 * MIB + 512); // interval 7 keeps 0
}

#[test]
fn bad_options_are_refused() {
    let bad = [
        CachingOptions {
            garbage_collection_threshold: 1.0,
            ..CachingOptions::default()
        },
        CachingOptions {
            garbage_collection_threshold: f64::NAN,
            ..CachingOptions::default()
        },
        CachingOptions {
            memory_fraction: 0.0,
            ..CachingOptions::default()
        },
        CachingOptions {
            divisions_by_interval: Some([3; 16]),
            ..CachingOptions::default()
        },
        CachingOptions {
            roundup_power2_divisions: 6,
            ..CachingOptions::default()
        },
    ];
    for o in bad {
        assert!(
            crate::replay::model_by_name("caching", GIB, o).is_err(),
            "{o:?}"
        );
    }
}
