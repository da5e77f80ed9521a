//! Hand cases with their exact optimum (by brute force), edge cases, and the checks every
//! plan must pass (`check`, shared with the property tests).

use super::bound::round_up;
use super::*;

/// Lifetimes as the planner reads them: `[s, s + 1)` for an empty one.
fn span(it: &Item) -> (u128, u128) {
    let s = it.start as u128;
    (
        s,
        if it.end > it.start {
            it.end as u128
        } else {
            s + 1
        },
    )
}

/// The peak of live aligned bytes, by looking at every start (where the peak must be).
pub fn live_peak_slow(items: &[Item], align: u64) -> u128 {
    items
        .iter()
        .map(|a| {
            let t = span(a).0;
            items
                .iter()
                .filter(|b| span(b).0 <= t && t < span(b).1)
                .map(|b| round_up(b.size, align))
                .sum::<u128>()
        })
        .max()
        .unwrap_or(0)
}

/// Every property a plan of `items` must have; panics (in tests) naming the first broken.
pub fn check(items: &[Item], align: u64, p: &Plan) {
    assert_eq!(p.offsets.len(), items.len());
    let mut top = 0u128;
    for (i, it) in items.iter().enumerate() {
        assert_eq!(p.offsets[i] % align, 0, "offset {i} not aligned");
        let sz = round_up(it.size, align);
        if sz > 0 {
            top = top.max(p.offsets[i] as u128 + sz);
        }
    }
    for (i, a) in items.iter().enumerate() {
        let (sa, ea) = (
            p.offsets[i] as u128,
            p.offsets[i] as u128 + round_up(a.size, align),
        );
        for (j, b) in items.iter().enumerate().skip(i + 1) {
            let (sb, eb) = (
                p.offsets[j] as u128,
                p.offsets[j] as u128 + round_up(b.size, align),
            );
            let time = span(a).0 < span(b).1 && span(b).0 < span(a).1;
            let space = sa < eb && sb < ea;
            assert!(
                !(time && space),
                "items {i} {a:?} at {sa} and {j} {b:?} at {sb} overlap"
            );
        }
    }
    assert_eq!(p.peak as u128, top, "peak is not the highest end");
    assert_eq!(
        p.bound as u128,
        live_peak_slow(items, align),
        "bound is not the live peak"
    );
    assert!(p.peak >= p.bound);
}

/// The optimum: first fit over every order (some order's first fit is optimal: take an
/// optimal plan and drop each item, lowest first, as low as it fits).
pub fn optimum(items: &[Item], align: u64) -> u128 {
    fn perms(n: usize, cur: &mut Vec<usize>, used: &mut Vec<bool>, f: &mut dyn FnMut(&[usize])) {
        if cur.len() == n {
            return f(cur);
        }
        for i in 0..n {
            if !used[i] {
                used[i] = true;
                cur.push(i);
                perms(n, cur, used, f);
                cur.pop();
                used[i] = false;
            }
        }
    }
    let mut best = u128::MAX;
    perms(
        items.len(),
        &mut Vec::new(),
        &mut vec![false; items.len()],
        &mut |order| {
            let mut placed: Vec<(usize, u128)> = Vec::new();
            let mut top = 0;
            for &i in order {
                let (s, e) = span(&items[i]);
                let sz = round_up(items[i].size, align);
                // small sizes only: the optimum is for hand cases and small random ones
                let mut near: Vec<(u64, u64)> = placed
                    .iter()
                    .filter(|&&(j, _)| span(&items[j]).0 < e && s < span(&items[j]).1)
                    .map(|&(j, o)| (o as u64, (o + round_up(items[j].size, align)) as u64))
                    .collect();
                let off = place::gap(&mut near, sz as u64, place::Fit::First) as u128;
                placed.push((i, off));
                if sz > 0 {
                    top = top.max(off + sz);
                }
            }
            best = best.min(top);
        },
    );
    best
}

fn it(size: u64, start: u64, end: u64) -> Item {
    Item { size, start, end }
}

#[test]
fn empty_input_is_an_empty_plan() {
    let p = plan(&[], 512);
    assert!(p.offsets.is_empty());
    assert_eq!((p.peak, p.bound), (0, 0));
}

#[test]
fn memory_is_reused_across_lifetimes() {
    let items = [it(100, 0, 2), it(100, 2, 4), it(50, 1, 3)];
    let p = plan(&items, 1);
    check(&items, 1, &p);
    assert_eq!(p.peak, 150);
}

/// Small cases with their optimum found by brute force: the plan must reach it.
#[test]
fn hand_cases_reach_the_optimum() {
    let cases: [&[(u64, u64, u64)]; 5] = [
        // a staircase: each item overlaps the next
        &[(2, 0, 2), (2, 1, 3), (2, 2, 4), (2, 3, 5)],
        // the largest item is short-lived: by size alone it takes the bottom
        &[(4, 2, 3), (2, 0, 6), (2, 0, 3), (2, 3, 6), (2, 1, 5)],
        // three sizes interleaved, live bytes never above 6
        &[
            (3, 0, 4),
            (3, 4, 8),
            (2, 0, 2),
            (1, 2, 6),
            (2, 6, 8),
            (3, 2, 6),
            (1, 0, 8),
        ],
        // a large block arriving when the small ones are spread out
        &[
            (1, 0, 3),
            (1, 0, 1),
            (1, 1, 3),
            (1, 0, 2),
            (3, 3, 4),
            (1, 2, 4),
        ],
        // optimum 16: the search at the peak reaches it from the size-class orders; from
        // the orders by size, lifetime, area and start it stays at 18
        &[(6, 8, 10), (4, 7, 13), (4, 3, 8), (4, 5, 9), (4, 5, 8)],
    ];
    for case in cases {
        let items: Vec<Item> = case.iter().map(|&(z, s, e)| it(z, s, e)).collect();
        let p = plan(&items, 1);
        check(&items, 1, &p);
        assert_eq!(p.peak as u128, optimum(&items, 1), "{items:?}");
    }
}

#[test]
fn alignment_rounds_every_size() {
    let items = [it(1, 0, 5), it(513, 0, 5), it(0, 0, 5), it(100, 5, 6)];
    let p = plan(&items, 512);
    check(&items, 512, &p);
    assert_eq!(p.peak, 512 + 1024);
    assert_eq!(p.bound, 512 + 1024);
}

#[test]
fn plans_are_deterministic() {
    let items: Vec<Item> = (0..500u64)
        .map(|i| it((i * 7919) % 4099 + 1, i % 97, i % 97 + 1 + (i * 31) % 50))
        .collect();
    let (a, b) = (plan(&items, 8), plan(&items, 8));
    assert_eq!(
        (a.offsets.clone(), a.peak, a.bound),
        (b.offsets, b.peak, b.bound)
    );
    check(&items, 8, &a);
}

#[test]
fn huge_sizes_saturate_or_error_never_panic() {
    let items = [
        it(u64::MAX, 0, 2),
        it(u64::MAX, 1, 3),
        it(u64::MAX - 5, u64::MAX, 0),
    ];
    let p = plan(&items, 512);
    assert_eq!(p.peak, u64::MAX);
    assert!(try_plan(&items, 512, &Options::default()).is_err());
    let one = [it(u64::MAX, 0, 1)];
    assert!(try_plan(&one, 1, &Options::default()).is_ok());
    // rounding u64::MAX up to 512 passes 2^64: an error, not an overflow
    assert!(try_plan(&one, 512, &Options::default()).is_err());
}

#[test]
fn bad_alignment_is_an_error_for_try_plan_and_rounded_for_plan() {
    let items = [it(3, 0, 1)];
    assert!(try_plan(&items, 0, &Options::default()).is_err());
    assert!(try_plan(&items, 24, &Options::default()).is_err());
    let p = plan(&items, 24);
    check(&items, 32, &p);
    assert_eq!(plan(&items, 0).peak, 3);
}

#[test]
fn no_budget_still_gives_a_valid_plan() {
    let items: Vec<Item> = (0..300u64)
        .map(|i| it(i % 13 * 100 + 1, i, i + 1 + i % 17))
        .collect();
    let opts = Options {
        budget: 0,
        rounds: 0,
    };
    let p = try_plan(&items, 1, &opts).unwrap();
    check(&items, 1, &p);
}

/// One step of a trace whose time-order plan is above its first greedy order's and that
/// above the bound: its tensors' sizes are (k + `more`) × 512 B. With `more` 0 (random case
/// 276 of a search for such a group) the plans reach 7,168, 6,144 and 5,120 B, with 1 9,728,
/// 7,680 and 7,168.
fn step_above_its_greedy_plan(t0: u64, more: u64) -> Vec<Item> {
    [
        (3, 1, 5),
        (1, 4, 7),
        (4, 6, 7),
        (3, 4, 6),
        (1, 5, 9),
        (3, 2, 8),
    ]
    .iter()
    .map(|&(k, s, e)| it((k + more) * 512, t0 + s, t0 + e))
    .collect()
}

/// What one greedy placement of `items` costs the budget: the pairs that overlap in time,
/// plus one for each item.
fn greedy_cost(items: &[Item]) -> u64 {
    let pairs = (0..items.len())
        .flat_map(|i| (i + 1..items.len()).map(move |j| (i, j)))
        .filter(|&(i, j)| items[i].start < items[j].end && items[j].start < items[i].end)
        .count();
    (pairs + items.len()) as u64
}

#[test]
fn the_budget_goes_to_the_step_that_sets_the_peak() {
    // two steps that share no instant are planned apart; the plan's peak is the higher one's
    let (a, b) = (
        step_above_its_greedy_plan(0, 0),
        step_above_its_greedy_plan(10, 1),
    );
    let cost = greedy_cost(&a); // b's too: the same lifetimes
    let peak = |items: &[Item], budget: u64| {
        let p = try_plan(items, 512, &Options { budget, rounds: 24 }).unwrap();
        check(items, 512, &p);
        (p.peak, p.exhausted)
    };
    let (sweep_b, greedy_b) = (peak(&b, 0).0, peak(&b, cost).0);
    assert!(sweep_b > greedy_b && greedy_b > peak(&a, 0).0);
    let two: Vec<Item> = a.iter().chain(&b).copied().collect();
    // one placement's budget goes to b, which sets the peak, not to a, the first and as cheap
    assert_eq!(peak(&two, cost), (greedy_b, false));
    // none: b keeps its time-order plan, and the plan says the budget ran out
    assert_eq!(peak(&two, cost - 1), (sweep_b, true));
    assert_eq!(
        peak(&two, Options::default().budget),
        (plan(&two, 512).bound, false)
    );
}

#[test]
fn a_step_repeated_with_the_same_tensors_is_planned_once() {
    // forty steps alike: one greedy placement's budget plans them all, where each planned
    // apart would leave thirty-nine at their time-order plans
    let one = step_above_its_greedy_plan(0, 0);
    let cost = greedy_cost(&one);
    let steps: Vec<Item> = (0..40)
        .flat_map(|k| step_above_its_greedy_plan(10 * k, 0))
        .collect();
    let opts = Options {
        budget: cost + cost / 2,
        rounds: 24,
    };
    let p = try_plan(&steps, 512, &opts).unwrap();
    check(&steps, 512, &p);
    let alone = try_plan(&one, 512, &opts).unwrap();
    assert_eq!((p.peak, p.exhausted), (alone.peak, false));
    assert!(
        alone.peak
            < try_plan(
                &one,
                512,
                &Options {
                    budget: 0,
                    rounds: 0
                }
            )
            .unwrap()
            .peak
    );
    // each step at the offsets of the first
    for (k, chunk) in p.offsets.chunks(one.len()).enumerate() {
        assert_eq!(chunk, &p.offsets[..one.len()], "step {k}");
    }
}

#[test]
fn items_live_throughout_go_at_the_bottom() {
    let items = [it(10, 0, 10), it(5, 0, 3), it(7, 3, 10), it(1, 0, 10)];
    let p = plan(&items, 1);
    check(&items, 1, &p);
    assert_eq!((p.offsets[0], p.offsets[3]), (0, 10));
    assert_eq!(p.peak, p.bound);
}

/// A training loop modelled on octnca_train3d (`docs/plan.md`): a block live throughout, and
/// each step a pair of long-lived blocks that overlaps the previous step's pair, then big
/// short-lived blocks, three at once at the step's peak, and a few small ones. Every greedy
/// order puts each pair above the previous one and leaves a hole at the peaks; alternating
/// the pairs between the bottom and the top reaches the bound.
fn octnca_like(steps: u64) -> Vec<Item> {
    const U: u64 = 900 << 20;
    let mut items = vec![it(U, 0, steps * 36 + 50)];
    for k in 0..steps {
        let b = k * 36 + 1;
        items.push(it(U, b, b + 38));
        items.push(it(U, b + 2, b + 40));
        for (s, e) in [(11, 21), (14, 18), (15, 23), (22, 27), (24, 26)] {
            items.push(it(4 * U, b + s, b + e));
        }
        for (s, e) in [(3, 9), (12, 13), (19, 30)] {
            items.push(it(2 << 20, b + s, b + e));
        }
    }
    items
}

#[test]
fn pairs_alternating_between_bottom_and_top_reach_the_bound() {
    // fails before the search under a target: the greedy orders end 1 unit (900 MiB) above
    let items = octnca_like(12);
    let p = plan(&items, 512);
    check(&items, 512, &p);
    assert_eq!(p.peak, p.bound, "{} over the bound", p.peak - p.bound);
}
