//! Which way a rank writes its slots under `CCL_SLOT_STORES=auto`, learned
//! from how long its large blocking calls take.
//!
//! Through the cache is fastest while the ranks' cores share one; on a VM
//! whose host moves vCPUs between chiplets there are phases in which it is
//! 5–10× slower, and streaming stores are then faster (see
//! [`SlotStores`]). The time of single steps does not show the phases (the
//! time goes between steps), so this times whole calls: per size class,
//! each way's cost is the least nanoseconds per byte of its last
//! [`WINDOW`] calls (timing noise only ever adds, and a slow phase raises
//! every call while a preempted call is a single spike). Some calls are
//! written the other way (probes), chosen from the call's sequence number
//! so that ranks probe the same calls: a class's 4th and 8th call; one in
//! 64 while through the cache is as fast as it has been; one in 4 while it
//! runs 1.5× slower than that (a slow phase may have begun); one in 16
//! while streaming. The choice follows the cheaper cost, with some
//! hysteresis. A class's first [`WARM`] calls
//! are not counted: they connect and touch fresh memory. Ranks that share
//! cores do not adapt: their calls' times swing with the scheduler (4 ranks
//! on 2 cores: 380–2400 µs for one 2 MiB size), which would drown the
//! signal, and the phases are about caches between cores of their own.

use crate::config::SlotStores;

/// Calls smaller than this keep writing through the cache: their slots are
/// few and their time is mostly hand-offs.
pub const ADAPT_MIN: usize = 256 << 10;
/// Calls of a class not counted: the first connect and fault in memory.
pub const WARM: u32 = 2;
/// Calls each way whose least time is that way's cost.
pub const WINDOW: usize = 4;
/// The other way must be this much cheaper before the choice changes.
const HYSTERESIS: f32 = 1.2;
/// Size classes: powers of two from `ADAPT_MIN` up.
const CLASSES: usize = 48;

#[derive(Clone, Copy, Debug, Default)]
struct Class {
    /// Nanoseconds per byte of the last calls through the cache and
    /// around it (0: none yet), and where the next goes.
    recent: [[f32; WINDOW]; 2],
    next: [usize; 2],
    /// The lowest cost through the cache has been (0: unknown).
    best: f32,
    around: bool,
    /// Calls timed so far.
    calls: u32,
}

impl Class {
    /// A way's cost: the least of its recent calls (0: none yet).
    fn cost(&self, around: bool) -> f32 {
        self.recent[usize::from(around)].iter().copied().filter(|&x| x > 0.0).reduce(f32::min).unwrap_or(0.0)
    }

    /// One call in how many is a probe.
    fn probe_every(&self) -> u64 {
        if self.around {
            16
        } else if self.cost(false) > 1.5 * self.best {
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
    /// Whether the ranks have cores of their own (`auto` adapts only then).
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
    /// Slots written as `stores` says; under `auto`, adapting only where
    /// the ranks have `own_cores`.
    pub fn new(stores: SlotStores, own_cores: bool) -> Self {
        SlotChooser { classes: [Class::default(); CLASSES], stores, own_cores }
    }

    /// The size class `auto` learns for calls of `bytes` bytes, if any.
    fn learning(&self, bytes: usize) -> Option<usize> {
        class(bytes).filter(|_| self.stores == SlotStores::Auto && self.own_cores)
    }

    /// Whether call number `seq` moving `bytes` bytes writes its slots
    /// around the cache, and whether its time should be
    /// [`observe`](Self::observe)d.
    pub fn pick(&self, bytes: usize, seq: u64) -> (bool, bool) {
        let Some(c) = self.learning(bytes) else {
            return (self.stores == SlotStores::Around, false);
        };
        let cl = &self.classes[c];
        let early = cl.calls == 3 || cl.calls == 7;
        let probe = early || ((seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) & (cl.probe_every() - 1)) == 0;
        (cl.around != probe, true)
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
    /// whether small messages spread, [`Plan::spread`](crate::exec::Plan::spread)).
    pub fn own_cores(&self) -> bool {
        self.own_cores
    }

    /// Whether every rank has a core of its own; where not, `auto` writes
    /// through the cache.
    pub fn set_own_cores(&mut self, on: bool) {
        self.own_cores = on;
    }

    /// Takes a call's time: `bytes` bytes with slots written `around` the
    /// cache or not, in `nanos` ns.
    pub fn observe(&mut self, bytes: usize, around: bool, nanos: u64) {
        let Some(c) = class(bytes) else {
            return;
        };
        let cl = &mut self.classes[c];
        cl.calls = cl.calls.saturating_add(1);
        if cl.calls <= WARM {
            return;
        }
        let w = usize::from(around);
        cl.recent[w][cl.next[w]] = nanos as f32 / bytes as f32;
        cl.next[w] = (cl.next[w] + 1) % WINDOW;
        let (through, streamed) = (cl.cost(false), cl.cost(true));
        if !around {
            cl.best = if cl.best == 0.0 { through } else { cl.best.min(through) };
        }
        if through > 0.0 && streamed > 0.0 {
            if cl.around && through * HYSTERESIS < streamed {
                cl.around = false;
            } else if !cl.around && streamed * HYSTERESIS < through {
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
    fn ranks_sharing_cores_write_through_the_cache() {
        let mut s = SlotChooser::default();
        run(&mut s, 0..100, 0.57, 0.124);
        assert!(s.chosen(1 << 20));
        s.set_own_cores(false);
        assert!(!s.chosen(1 << 20));
        assert!((0..100).all(|seq| s.pick(1 << 20, seq) == (false, false)));
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
