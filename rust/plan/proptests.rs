//! Random items through the planner: every plan is checked whole (`tests::check`), and on
//! small inputs its peak is compared with the optimum found by brute force.

use proptest::prelude::*;

use super::tests::{check, optimum};
use super::*;

fn items(max: usize, sizes: u64, times: u64) -> impl Strategy<Value = Vec<Item>> {
    prop::collection::vec(
        (0..sizes, 0..times, 0..times).prop_map(|(size, a, b)| Item {
            size,
            start: a.min(b),
            end: a.max(b),
        }),
        0..max,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn plans_are_valid(items in items(80, 1 << 20, 64), align in prop::sample::select(vec![1u64, 8, 512])) {
        let p = plan(&items, align);
        check(&items, align, &p);
        let again = plan(&items, align);
        prop_assert_eq!(p.offsets, again.offsets);
    }

    #[test]
    fn plans_without_budget_are_valid(items in items(80, 5000, 40)) {
        let p = try_plan(&items, 4, &Options { budget: 0, rounds: 0 }).unwrap();
        check(&items, 4, &p);
    }

    #[test]
    fn huge_sizes_never_panic(items in items(12, u64::MAX, 8), align in prop::sample::select(vec![1u64, 512, 1 << 63])) {
        let p = plan(&items, align);
        prop_assert!(p.peak >= p.bound);
        if let Ok(p) = try_plan(&items, align, &Options::default()) {
            check(&items, align, &p);
        }
    }

    #[test]
    fn small_plans_are_near_the_optimum(items in items(7, 16, 10)) {
        let p = plan(&items, 1);
        check(&items, 1, &p);
        let best = optimum(&items, 1);
        prop_assert!(p.peak as u128 >= best);
        // the heuristics are not exact; they must stay within half again of the optimum
        prop_assert!(2 * p.peak as u128 <= 3 * best, "{} vs optimum {}", p.peak, best);
    }
}
