//! Races on shared buffers: where a schedule reaches its peers' memory,
//! every two accesses of an element by different ranks (one of them a
//! write) must be ordered by messages, and every access of a rank's memory
//! must happen before that rank returns (it then owns its buffers again).
//!
//! Each channel of each rank is a thread with a vector clock: a step ticks
//! its own entry, a message carries the sender's clock and the receiver
//! takes the larger of each entry. Every element remembers its last write
//! and the reads since, each with its thread's clock then; an access that
//! the current thread's clock does not show to have happened after them
//! races. A rank's memory counts as written by it as it enters the call,
//! and its channels start knowing that entry.

/// The clocks and the elements' history of one verification.
pub(super) struct Races {
    /// Channels per rank (threads are `rank × per + channel`).
    per: usize,
    /// Per thread, its vector clock.
    clock: Vec<Vec<u32>>,
    /// Per rank, per buffer (input, output), per element.
    stamps: Vec<[Vec<Stamp>; 2]>,
}

/// An access: the thread and its own clock entry at the time.
type At = (u32, u32);

#[derive(Clone, Debug)]
struct Stamp {
    write: At,
    reads: Vec<At>,
}

const BUF: [&str; 2] = ["input", "output"];

impl Races {
    /// For ranks whose buffers hold `lens[r]` (input, output) elements and
    /// run at most `per` channels.
    pub fn new(lens: &[(usize, usize)], per: usize) -> Self {
        let (n, per) = (lens.len(), per.max(1));
        let clock = (0..n * per)
            .map(|t| {
                let mut v = vec![0u32; n * per];
                let r = t / per;
                v[r * per..(r + 1) * per].fill(1);
                v
            })
            .collect();
        let entered = |r: usize, len: usize| vec![Stamp { write: ((r * per) as u32, 1), reads: Vec::new() }; len];
        let stamps = lens.iter().enumerate().map(|(r, &(i, o))| [entered(r, i), entered(r, o)]).collect();
        Races { per, clock, stamps }
    }

    fn thread(&self, r: usize, c: usize) -> usize {
        r * self.per + c
    }

    fn who(&self, (t, _): At) -> String {
        let t = t as usize;
        format!("rank {} channel {}", t / self.per, t % self.per)
    }

    /// Rank `r`'s channel `c` takes a step; its clock now, to send with a message.
    pub fn tick(&mut self, r: usize, c: usize) -> Vec<u32> {
        let t = self.thread(r, c);
        self.clock[t][t] += 1;
        self.clock[t].clone()
    }

    /// Rank `r`'s channel `c` receives a message sent at clock `sent`.
    pub fn receive(&mut self, r: usize, c: usize, sent: &[u32]) {
        let t = self.thread(r, c);
        for (a, &b) in self.clock[t].iter_mut().zip(sent) {
            *a = (*a).max(b);
        }
    }

    fn before(&self, t: usize, (u, k): At) -> bool {
        u as usize == t || self.clock[t][u as usize] >= k
    }

    /// Rank `r`'s channel `c` reads (or writes, if `write`) elements
    /// `from..to` of buffer `buf` (0: input, 1: output) of rank `owner`.
    pub fn access(&mut self, (r, c): (usize, usize), (owner, buf, from, to): (usize, usize, usize, usize), write: bool) -> Result<(), String> {
        let t = self.thread(r, c);
        let now = (t as u32, self.clock[t][t]);
        for i in from..to {
            let s = &self.stamps[owner][buf][i];
            let what = |other: At, did: &str| {
                format!(
                    "{} rank {owner}'s {}[{i}], which {} {did} unordered with it",
                    if write { "writes" } else { "reads" },
                    BUF[buf],
                    self.who(other)
                )
            };
            if !self.before(t, s.write) {
                return Err(what(s.write, "writes"));
            }
            if write {
                if let Some(&other) = s.reads.iter().find(|&&a| !self.before(t, a)) {
                    return Err(what(other, "reads"));
                }
            }
            let s = &mut self.stamps[owner][buf][i];
            if write {
                *s = Stamp { write: now, reads: Vec::new() };
            } else {
                match s.reads.iter_mut().find(|a| a.0 == now.0) {
                    Some(a) => a.1 = now.1,
                    None => s.reads.push(now),
                }
            }
        }
        Ok(())
    }

    /// Every access of rank `r`'s buffers happened before it returns
    /// (after all its channels).
    pub fn returns(&self, r: usize) -> Result<(), String> {
        let mut exit = vec![0u32; self.clock.len()];
        for c in 0..self.per {
            for (a, &b) in exit.iter_mut().zip(&self.clock[self.thread(r, c)]) {
                *a = (*a).max(b);
            }
        }
        let after = |(u, k): At| exit[u as usize] >= k;
        for (buf, stamps) in self.stamps[r].iter().enumerate() {
            for (i, s) in stamps.iter().enumerate() {
                let late = std::iter::once(&s.write).chain(&s.reads).find(|&&a| !after(a));
                if let Some(&a) = late {
                    return Err(format!("rank {r} returns while {} may still use its {}[{i}]", self.who(a), BUF[buf]));
                }
            }
        }
        Ok(())
    }
}
