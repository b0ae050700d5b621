//! Ranks that disagree on a call's root or count: every rank fails naming
//! both calls, at the call itself under `CCL_CHECK=full`, and by default
//! while one waits on the other or at the next call, never by the
//! deadline. Ranks as threads.

use ccl::config::CheckMode;
use ccl::testing::LocalJob;
use ccl::{Config, Error, ErrorKind, Sum};
use std::time::Duration;

/// A deadline far beyond what finding the disagreement takes: a test
/// that ends by it fails (the error is then a timeout).
fn config(check: CheckMode) -> Config {
    Config { timeout: Duration::from_secs(60), check, ..Config::default() }
}

/// `e` is a mismatch whose two calls are the ones `want` names, in either
/// order (this rank's is one of them).
fn names_both(e: &Error, want: [&str; 2]) {
    assert!(matches!(e.kind(), ErrorKind::Mismatch { .. }), "not a mismatch: {e}");
    let s = e.to_string();
    assert!(want.iter().all(|w| s.contains(w)), "{s} does not name {want:?}");
}

#[test]
fn a_broadcast_whose_ranks_each_think_themselves_root_fails_by_the_next_call() {
    for n in [2, 3] {
        let out = LocalJob::new(n).config(config(CheckMode::Default)).run(|g| {
            let c = g.typed::<f32>();
            let mut v = vec![g.rank() as f32; 4];
            let first = c.broadcast(&mut v, g.rank());
            let mut w = vec![1.0f32; 4];
            (first, c.all_reduce(&mut w, Sum))
        });
        for (rank, (first, next)) in out.into_iter().enumerate() {
            // the call itself may end well on each rank (nothing it sends is checked)
            let e = first.err().or(next.err()).unwrap_or_else(|| panic!("rank {rank} of {n} saw nothing wrong"));
            let own = format!("root {rank})");
            names_both(&e, [&own, "but the peer called broadcast("]);
            assert_eq!(e.to_string().matches("root ").count(), 2, "{e}");
        }
    }
}

#[test]
fn a_reduce_whose_ranks_disagree_on_the_root_fails_instead_of_hanging() {
    for n in [2, 3, 4] {
        let out = LocalJob::new(n).config(config(CheckMode::Default)).run(|g| {
            let mut v = vec![1.0f32; 8];
            g.typed::<f32>().reduce(&mut v, Sum, g.rank())
        });
        for (rank, r) in out.into_iter().enumerate() {
            let e = r.expect_err("roots differ");
            names_both(&e, [&format!("root {rank})"), "reduce("]);
        }
    }
}

#[test]
fn a_large_broadcast_of_many_roots_fails_instead_of_hanging() {
    let out = LocalJob::new(4).config(config(CheckMode::Default)).run(|g| {
        let mut v = vec![g.rank() as f32; 4 << 20];
        g.typed::<f32>().broadcast(&mut v, g.rank())
    });
    for (rank, r) in out.into_iter().enumerate() {
        let root = format!("root {rank})");
        names_both(&r.expect_err("roots differ"), [&root, "broadcast(4194304 × f32"]);
    }
}

#[test]
fn a_rank_passing_no_elements_where_the_others_pass_1000_fails_by_its_next_call() {
    let out = LocalJob::new(3).config(config(CheckMode::Default)).run(|g| {
        let c = g.typed::<f32>();
        let mut v = vec![1.0f32; if g.rank() == 1 { 0 } else { 1000 }];
        let first = c.all_reduce(&mut v, Sum);
        let mut w = vec![1.0f32; 4];
        (first, c.all_reduce(&mut w, Sum))
    });
    for (rank, (first, next)) in out.into_iter().enumerate() {
        let e = first.err().or(next.err()).unwrap_or_else(|| panic!("rank {rank} saw nothing wrong"));
        // the ranks of 1000 name the rank of none; it names one of them
        names_both(&e, ["all_reduce(1000 × f32", "all_reduce(0 × f32"]);
    }
}

#[test]
fn under_full_checking_every_rank_fails_at_the_call_itself() {
    let out = LocalJob::new(3).config(config(CheckMode::Full)).run(|g| {
        let c = g.typed::<f32>();
        let mut v = vec![1.0f32; 4];
        // calls that agree run as ever, checked
        c.all_reduce(&mut v, Sum).expect("agreed");
        let roots = c.broadcast(&mut v, g.rank()).expect_err("roots differ");
        let mut n = vec![1.0f32; if g.rank() == 2 { 0 } else { 1000 }];
        let counts = c.all_reduce(&mut n, Sum).expect_err("counts differ");
        (v, roots, counts)
    });
    for (rank, (v, roots, counts)) in out.into_iter().enumerate() {
        assert_eq!(v, vec![3.0; 4]);
        names_both(&roots, [&format!("root {rank})"), "broadcast(4 × f32"]);
        assert!(roots.to_string().contains(&format!("rank {rank}, broadcast #1")), "{roots}");
        names_both(&counts, ["all_reduce(1000 × f32", "all_reduce(0 × f32"]);
    }
}

#[test]
fn gathers_scatters_and_scans_that_disagree_fail_on_every_rank_at_the_call() {
    let out = LocalJob::new(3).config(config(CheckMode::Full)).run(|g| {
        let (c, r) = (g.typed::<f32>(), g.rank());
        // roots that differ: each rank thinks itself the root
        let mut all = vec![0.0f32; 6];
        let roots = c.gather(&[1.0f32, 2.0], &mut all, r).expect_err("roots differ");
        // counts that differ: rank 2 takes 3 elements, the others 2
        let mine = vec![0.0f32; if r == 2 { 3 } else { 2 }];
        let send = if r == 0 { vec![1.0f32; 6] } else { vec![] };
        let counts = c.scatter(&send, &mut mine.clone(), 0).expect_err("counts differ");
        // operators that differ
        let mut v = vec![1.0f32; 4];
        let ops = if r == 1 { c.scan(&mut v, ccl::Max) } else { c.scan(&mut v, Sum) }.expect_err("operators differ");
        (roots, counts, ops)
    });
    for (rank, (roots, counts, ops)) in out.into_iter().enumerate() {
        names_both(&roots, [&format!("gather(2 × f32 of 4 B, root {rank})"), "gather("]);
        names_both(&counts, ["scatter(2 × f32", "scatter(3 × f32"]);
        names_both(&ops, ["scan(4 × f32 of 4 B, sum)", "scan(4 × f32 of 4 B, max)"]);
    }
}

/// Two operators of one name, each in a module of its own.
mod first {
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Pick;
    impl ccl::Op for Pick {
        const NAME: &'static str = "pick";
    }
    impl ccl::ReduceOp<f32> for Pick {
        fn combine(a: f32, b: f32) -> f32 {
            a.max(b)
        }
    }
}

mod second {
    #[derive(Clone, Copy, Debug, Default)]
    pub struct Pick;
    impl ccl::Op for Pick {
        const NAME: &'static str = "pick";
    }
    impl ccl::ReduceOp<f32> for Pick {
        fn combine(a: f32, b: f32) -> f32 {
            a.min(b)
        }
    }
}

#[test]
fn operators_of_one_name_but_two_types_are_two_calls() {
    for check in [CheckMode::Default, CheckMode::Full] {
        let out = LocalJob::new(2).config(config(check)).run(|g| {
            let mut v = vec![g.rank() as f32; 64];
            let c = g.typed::<f32>();
            if g.rank() == 0 {
                c.all_reduce(&mut v, first::Pick)
            } else {
                c.all_reduce(&mut v, second::Pick)
            }
        });
        for (rank, r) in out.into_iter().enumerate() {
            let e = r.expect_err("the operators differ");
            assert!(matches!(e.kind(), ErrorKind::Mismatch { .. }), "rank {rank}, {check:?}: {e}");
        }
    }
    // the same operator on every rank is one call
    let out = LocalJob::new(2).config(config(CheckMode::Full)).run(|g| {
        let mut v = vec![g.rank() as f32; 64];
        g.typed::<f32>().all_reduce(&mut v, first::Pick).map(|()| v[0])
    });
    assert!(out.into_iter().all(|r| r.expect("one call") == 1.0));
}

#[test]
fn varying_counts_that_disagree_fail_on_every_rank_naming_both() {
    use ccl::Counts;
    for check in [CheckMode::Default, CheckMode::Full] {
        let out = LocalJob::new(3).config(config(check)).run(|g| {
            let (c, r) = (g.typed::<f32>(), g.rank());
            // rank 2 thinks rank 0 has 3 elements, the others 2
            let counts = Counts::new(&[if r == 2 { 3 } else { 2 }, 1, 4]).expect("counts");
            let mine = vec![1.0f32; counts.count(r)];
            let mut all = vec![0.0f32; counts.extent()];
            let gathered = c.all_gatherv(&mine, &mut all, &counts).expect_err("counts differ");
            (gathered, c.all_reduce(&mut [1.0f32], Sum))
        });
        for (rank, (gathered, _)) in out.into_iter().enumerate() {
            names_both(&gathered, ["this rank called all_gatherv(counts #", "peer called all_gatherv(counts #"]);
            assert!(gathered.to_string().contains(&format!("rank {rank}")), "{gathered}");
        }
    }
}

#[test]
fn an_all_to_allv_whose_pairs_disagree_fails_naming_both_sides() {
    use ccl::Counts;
    // every rank sends every other 2 elements, but rank 1 sends rank 2
    // five, and rank 2 expects seven from it
    let run = |check| {
        LocalJob::new(3).config(config(check)).run(|g| {
            let (c, r) = (g.typed::<u32>(), g.rank());
            let sends = Counts::new(&[2, 2, if r == 1 { 5 } else { 2 }]).expect("counts");
            let recvs = Counts::new(&[2, if r == 2 { 7 } else { 2 }, 2]).expect("counts");
            let (send, mut recv) = (vec![r as u32; sends.extent()], vec![0u32; recvs.extent()]);
            c.all_to_allv(&send, &sends, &mut recv, &recvs)
        })
    };
    // checked first: every rank, at the call, names the pair
    for (rank, r) in run(CheckMode::Full).into_iter().enumerate() {
        let e = r.expect_err("pair disagrees");
        names_both(&e, ["rank 2 receives 7 elements from rank 1", "rank 1 sends it 5"]);
        assert!(e.to_string().contains(&format!("rank {rank}")), "{e}");
    }
    // by default the receiver finds it on the first message, naming both counts
    let e = run(CheckMode::Default).swap_remove(2).expect_err("rank 2 expects more");
    names_both(&e, ["all_to_allv(7 to one peer", "all_to_allv(5 to one peer"]);
}
