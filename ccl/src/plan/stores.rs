//! Which way a rank writes its slots under `CCL_SLOT_STORES=auto`, learned
//! from how long its large blocking calls take.
//!
//! Through the cache is fastest while the ranks' cores share one; where
//! they do not (a VM's vCPUs on chiplets that share none, for phases of
//! seconds), streaming stores are faster (see [`SlotStores`] and
//! `bench/results/slot-stores.md`). The time of single steps does not show
//! the phases (the time goes between steps), so this times whole calls:
//! per size class, each way's cost is the least nanoseconds per byte of its
//! last [`WINDOW`] calls (timing noise only ever adds, and a slow phase
//! raises every call while a preempted call is a single spike). Some calls
//! are written the other way (probes), chosen from the call's sequence
//! number so that ranks probe the same calls: a class's 4th and 5th call
//! (while a benchmark warms up); one in 64 while through the cache is as
//! fast as it has been; one in 4 while it runs slower than that by an
//! alarm margin (a slow phase may have begun); while streaming, about one
//! in 8 times the ratio of the two costs (16 to 64), so that probes cost
//! little and come more often where the choice may have rested on noise.
//! The choice follows the cheaper cost, with hysteresis, weighing only
//! calls among the class's last [`FRESH`], at least [`CONFIRM`] each way, so
//! that a slow phase is not weighed against probes from before it. A
//! class's first [`WARM`] calls are not counted: they connect and touch
//! fresh memory. Ranks that share cores adapt too, from a larger size and
//! with wider margins ([`SHARING`]): their calls' times swing with the
//! scheduler.

use crate::config::SlotStores;

/// Calls smaller than this keep writing through the cache: their slots are
/// few and their time is mostly hand-offs.
pub const ADAPT_MIN: usize = 256 << 10;
/// Calls of a class not counted: the first connect and fault in memory.
pub const WARM: u32 = 2;
/// Calls each way whose least time is that way's cost.
pub const WINDOW: usize = 4;
/// A switch weighs only calls among the class's last this many, and at
/// least [`CONFIRM`] of them each way.
pub const FRESH: u32 = 24;
/// Calls each way a switch needs among the last [`FRESH`].
pub const CONFIRM: usize = 2;

/// How a rank adapts.
#[derive(Clone, Copy, Debug)]
struct Adapt {
    /// Calls of at least this many bytes are timed (at least [`ADAPT_MIN`]).
    from: usize,
    /// The other way's cost times this must be under the chosen one's.
    switch: f32,
    /// Through the cache costing this times its best so far: probe 1 in 4.
    alarm: f32,
}

/// Ranks with a core of their own.
const OWN_CORE: Adapt = Adapt { from: ADAPT_MIN, switch: 1.2, alarm: 1.5 };
/// Ranks sharing cores, whose calls' times swing with the scheduler: wider
/// margins, and from 1 MiB: below it, adapting cost them more than it
/// saved (`bench/results/slot-stores.md`).
const SHARING: Adapt = Adapt { from: 1 << 20, switch: 1.5, alarm: 3.0 };

/// Size classes: powers of two from `ADAPT_MIN` up.
const CLASSES: usize = 48;

#[derive(Clone, Copy, Debug, Default)]
struct Class {
    /// Nanoseconds per byte of the last calls through the cache and
    /// around it (0: none yet), and where the next goes.
    recent: [[f32; WINDOW]; 2],
    /// Which of the class's calls each of `recent` was.
    at: [[u32; WINDOW]; 2],
    next: [usize; 2],
    /// The lowest cost through the cache has been (0: unknown).
    best: f32,
    around: bool,
    /// Calls timed so far.
    calls: u32,
}

impl Class {
    /// How many of a way's recent calls fall among the class's last
    /// `within`, and the least cost of those (infinite: none).
    fn least(&self, around: bool, within: u32) -> (usize, f32) {
        let w = usize::from(around);
        (self.recent[w].iter().zip(&self.at[w]))
            .filter(|&(&x, &at)| x > 0.0 && self.calls - at < within)
            .fold((0, f32::INFINITY), |(n, least), (&x, _)| (n + 1, least.min(x)))
    }

    /// A way's cost: the least of its recent calls (0: none yet).
    fn cost(&self, around: bool) -> f32 {
        match self.least(around, u32::MAX) {
            (0, _) => 0.0,
            (_, least) => least,
        }
    }

    /// A way's cost over its calls among the last [`FRESH`], if there were
    /// at least [`CONFIRM`]: a switch does not rest on one call, nor on
    /// calls from before a slow phase began (early probes, say, against
    /// calls through the cache slowed by the phase).
    fn fresh(&self, around: bool) -> Option<f32> {
        let (n, least) = self.least(around, FRESH);
        (n >= CONFIRM).then_some(least)
    }

    /// One call in how many is a probe.
    fn probe_every(&self, m: Adapt) -> u64 {
        if self.around {
            // 8 only until through the cache has a cost
            let ratio = self.cost(false) / self.cost(true).max(f32::MIN_POSITIVE);
            ((ratio * 8.0) as u64).clamp(8, 64).next_power_of_two()
        } else if self.cost(false) > m.alarm * self.best {
            4
        } else {
            64
        }
    }
}

/// One group's way of writing slots: fixed by `CCL_SLOT_STORES`, or
/// chosen per size class under `auto`.
#[derive(Clone, Debug)]
pub struct SlotChooser {
    classes: [Class; CLASSES],
    /// The setting.
    stores: SlotStores,
    /// Whether the ranks have cores of their own (else `auto` adapts with
    /// wider margins).
    own_cores: bool,
}

impl Default for SlotChooser {
    fn default() -> Self {
        SlotChooser::new(SlotStores::Auto, true)
    }
}

fn class(bytes: usize) -> Option<usize> {
    (bytes >= ADAPT_MIN).then(|| ((bytes / ADAPT_MIN).ilog2() as usize).min(CLASSES - 1))
}

impl SlotChooser {
    /// Slots written as `stores` says; under `auto`, adapting with the
    /// margins of ranks with `own_cores` or of ranks sharing cores.
    pub fn new(stores: SlotStores, own_cores: bool) -> Self {
        SlotChooser { classes: [Class::default(); CLASSES], stores, own_cores }
    }

    /// The size class `auto` learns for calls of `bytes` bytes, if any.
    fn learning(&self, bytes: usize) -> Option<usize> {
        class(bytes).filter(|_| self.stores == SlotStores::Auto && bytes >= self.adapt().from)
    }

    /// Whether call number `seq` moving `bytes` bytes writes its slots
    /// around the cache, and whether its time should be
    /// [`observe`](Self::observe)d.
    pub fn pick(&self, bytes: usize, seq: u64) -> (bool, bool) {
        let Some(c) = self.learning(bytes) else {
            return (self.stores == SlotStores::Around, false);
        };
        let cl = &self.classes[c];
        let early = cl.calls == 3 || cl.calls == 4;
        let probe =
            early || ((seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) & (cl.probe_every(self.adapt()) - 1)) == 0;
        (cl.around != probe, true)
    }

    fn adapt(&self) -> Adapt {
        if self.own_cores {
            OWN_CORE
        } else {
            SHARING
        }
    }

    /// Whether calls of `bytes` bytes are now written around the cache
    /// (no probes: for calls not timed).
    pub fn chosen(&self, bytes: usize) -> bool {
        match self.learning(bytes) {
            Some(c) => self.classes[c].around,
            None => self.stores == SlotStores::Around,
        }
    }

    /// Whether every rank has a core of its own (which also decides
    /// whether small messages spread, [`Plan::spread`](super::Plan::spread)).
    pub fn own_cores(&self) -> bool {
        self.own_cores
    }

    /// Takes a call's time: `bytes` bytes with slots written `around` the
    /// cache or not, in `nanos` ns.
    pub fn observe(&mut self, bytes: usize, around: bool, nanos: u64) {
        let Some(c) = class(bytes) else {
            return;
        };
        let m = self.adapt();
        let cl = &mut self.classes[c];
        cl.calls = cl.calls.saturating_add(1);
        if cl.calls <= WARM {
            return;
        }
        let w = usize::from(around);
        cl.recent[w][cl.next[w]] = nanos as f32 / bytes as f32;
        cl.at[w][cl.next[w]] = cl.calls;
        cl.next[w] = (cl.next[w] + 1) % WINDOW;
        if !around {
            let through = cl.cost(false);
            cl.best = if cl.best == 0.0 { through } else { cl.best.min(through) };
        }
        if let (Some(through), Some(streamed)) = (cl.fresh(false), cl.fresh(true)) {
            if cl.around && through * m.switch < streamed {
                cl.around = false;
            } else if !cl.around && streamed * m.switch < through {
                cl.around = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs calls `from..to` of 1 MiB that take `through` or `around` ns
    /// per byte; how many were written around the cache.
    fn run(s: &mut SlotChooser, calls: std::ops::Range<u64>, through: f32, around: f32) -> u64 {
        let bytes = 1 << 20;
        let mut streamed = 0;
        for seq in calls {
            let (a, timed) = s.pick(bytes, seq);
            assert!(timed);
            streamed += u64::from(a);
            s.observe(bytes, a, ((if a { around } else { through }) * bytes as f32) as u64);
        }
        streamed
    }

    #[test]
    fn small_calls_write_through_the_cache_untimed() {
        let s = SlotChooser::default();
        for seq in 0..100 {
            assert_eq!(s.pick(ADAPT_MIN - 1, seq), (false, false));
        }
        assert!(!s.chosen(8));
    }

    #[test]
    fn follows_the_cheaper_way_and_probes_more_when_the_cache_gets_slow() {
        let mut s = SlotChooser::default();
        // a shared cache: 70 µs a MiB through it, 130 around it
        let streamed = run(&mut s, 0..1600, 0.067, 0.124);
        assert!(!s.chosen(1 << 20));
        assert!((10..50).contains(&streamed), "{streamed} probes in 1600 calls");
        // a slow phase: 600 µs through the cache; noticed within a few calls
        run(&mut s, 1600..1640, 0.57, 0.124);
        assert!(s.chosen(1 << 20));
        let streamed = run(&mut s, 1640..1800, 0.57, 0.124);
        assert!(streamed > 140, "{streamed} of 160");
        // other sizes learn on their own
        assert!(!s.chosen(8 << 20));
        // and the fast phase again
        run(&mut s, 1800..2000, 0.067, 0.124);
        assert!(!s.chosen(1 << 20));
    }

    #[test]
    fn ranks_sharing_cores_adapt_with_wider_margins() {
        let shared = || SlotChooser::new(SlotStores::Auto, false);
        // and only from 1 MiB
        assert!((0..100).all(|seq| shared().pick(SHARING.from / 2, seq) == (false, false)));
        assert!(SlotChooser::default().pick(SHARING.from / 2, 0).1);
        // streaming 1.4x cheaper: ranks with cores of their own switch,
        // ranks sharing cores (whose times swing that much) do not
        let mut own = SlotChooser::default();
        run(&mut own, 0..200, 0.28, 0.2);
        assert!(own.chosen(1 << 20));
        let mut s = shared();
        let streamed = run(&mut s, 0..200, 0.28, 0.2);
        assert!(!s.chosen(1 << 20));
        assert!(streamed < 10, "{streamed} streamed");
        // through the cache 2.5x its best (a scheduler's swing): still only
        // the rare probe, where ranks with cores of their own probe 1 in 4
        let (mut s, mut own) = (shared(), SlotChooser::default());
        run(&mut s, 0..100, 0.2, 0.4);
        run(&mut own, 0..100, 0.2, 0.4);
        let (a, b) = (run(&mut s, 100..500, 0.5, 0.9), run(&mut own, 100..500, 0.5, 0.9));
        assert!(a < 20 && b > 60, "probes: {a} sharing, {b} own");
        // the far placement: through the cache 4x slower, streaming 2x
        // cheaper than that; noticed within a few calls, and kept
        run(&mut s, 500..540, 0.8, 0.4);
        assert!(s.chosen(1 << 20));
        let streamed = run(&mut s, 540..700, 0.8, 0.4);
        assert!(streamed > 140, "{streamed} of 160");
        // and back
        run(&mut s, 700..1000, 0.2, 0.4);
        assert!(!s.chosen(1 << 20));
    }

    #[test]
    fn streaming_probes_the_cache_more_often_the_closer_the_costs() {
        // probes cost (ratio - 1) / every: the closer the costs, the more
        // often the cache is tried, so a choice that rested on noise is
        // undone soon and a clear one is not paid for heavily
        let probes = |through: f32| {
            let mut s = SlotChooser::default();
            run(&mut s, 0..100, through, 0.1);
            assert!(s.chosen(1 << 20));
            3000 - run(&mut s, 100..3100, through, 0.1)
        };
        let (close, far) = (probes(0.15), probes(1.0));
        assert!(close > 2 * far, "{close} probes at 1.5x, {far} at 10x");
        assert!((3000 / 32..3000 / 8).contains(&close) && (3000 / 128..3000 / 32).contains(&far), "{close} {far}");
    }

    #[test]
    fn a_fixed_setting_is_kept_and_never_timed() {
        for (stores, around) in [(SlotStores::Cache, false), (SlotStores::Around, true)] {
            let s = SlotChooser::new(stores, true);
            for bytes in [8, 1 << 20, 1 << 30] {
                assert_eq!(s.chosen(bytes), around);
                assert!((0..100).all(|seq| s.pick(bytes, seq) == (around, false)));
            }
        }
    }

    #[test]
    fn the_first_calls_do_not_count() {
        let mut s = SlotChooser::default();
        // connecting makes the first two calls slow whichever way they go
        for seq in 0..u64::from(WARM) {
            let (a, _) = s.pick(1 << 20, seq);
            s.observe(1 << 20, a, 1 << 30);
        }
        run(&mut s, 2..400, 0.067, 0.124);
        assert!(!s.chosen(1 << 20));
        assert!(s.classes[2].cost(false) < 0.1, "{:?}", s.classes[2]);
    }

    #[test]
    fn a_preempted_call_does_not_switch() {
        let mut s = SlotChooser::default();
        run(&mut s, 0..200, 0.067, 0.124);
        // one call 30x slower (2 ms for 1 MiB), then fast again
        let (a, _) = s.pick(1 << 20, 200);
        assert!(!a);
        s.observe(1 << 20, a, 2_000_000);
        let streamed = run(&mut s, 201..400, 0.067, 0.124);
        assert!(!s.chosen(1 << 20));
        assert!(streamed < 15, "{streamed} streamed after one slow call");
    }

    #[test]
    fn a_switch_rests_on_recent_calls_each_way() {
        // runs calls one by one: none may switch to streaming
        let stays = |s: &mut SlotChooser, calls: std::ops::Range<u64>, through: f32, around: f32| {
            for seq in calls {
                run(s, seq..seq + 1, through, around);
                assert!(!s.chosen(1 << 20), "streaming after call {seq}");
            }
        };
        // a slow phase slows both ways (3x): the early probes, cheaper than
        // the calls through the cache in the phase, are too old to count
        let mut s = SlotChooser::default();
        let streamed = run(&mut s, 0..36, 0.055, 0.08);
        assert!((2..=3).contains(&streamed), "{streamed}: the early probes and a rare one");
        stays(&mut s, 36..50, 0.165, 0.24);
        stays(&mut s, 50..100, 0.055, 0.08);
        // nor does one slow call through the cache (still faulting in
        // memory) against the early probes
        let mut s = SlotChooser::default();
        for seq in 0..u64::from(WARM) {
            s.observe(1 << 20, s.pick(1 << 20, seq).0, 1 << 30);
        }
        let (a, _) = s.pick(1 << 20, 2);
        assert!(!a);
        s.observe(1 << 20, a, (0.2 * (1 << 20) as f32) as u64);
        stays(&mut s, 3..40, 0.055, 0.08);
    }

    #[test]
    fn a_small_difference_does_not_switch() {
        let mut s = SlotChooser::default();
        run(&mut s, 0..2000, 0.070, 0.067);
        assert!(!s.chosen(1 << 20));
    }

    #[test]
    fn ranks_probe_the_same_calls() {
        let (a, mut b) = (SlotChooser::default(), SlotChooser::default());
        let (mut probes_a, mut probes_b) = (0, 0);
        // in the same state, the same calls; b streaming probes more often,
        // on a superset of a's calls
        b.classes[0].around = true;
        for seq in 0..2000 {
            let probe_a = a.pick(1 << 18, seq).0;
            let probe_b = !b.pick(1 << 18, seq).0;
            assert!(!probe_a || probe_b, "call {seq}");
            probes_a += u32::from(probe_a);
            probes_b += u32::from(probe_b);
        }
        assert!(probes_a > 10 && probes_b > 3 * probes_a, "{probes_a} {probes_b}");
    }
}
