//! Call fingerprints: every slot carries a 32-byte summary of the sender's
//! call, and the receiver compares it with its own. Ranks that disagree —
//! a different collective, element type, count, operator, root, or call
//! order — fail on the first message with both sides' calls in the error,
//! instead of hanging or reading data of another shape.

use crate::algo::Coll;
use crate::op::ReduceOp;
use crate::Reduce;
use std::fmt;
use std::marker::PhantomData;

/// The words a slot carries: call kind, element size and root; count and
/// shared buffers; type and operator name hashes; sequence number.
pub type Words = [u64; 4];

/// What a call is, as its peers must agree on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    /// The collective (send and recv compare as one point-to-point kind).
    pub coll: Coll,
    /// Element size in bytes.
    pub elem_size: u32,
    /// Hash of the element type's name.
    pub type_hash: u32,
    /// Hash of the operator's name (0 for calls that do not reduce).
    pub op_hash: u32,
    /// Element count (the low [`COUNT_BITS`] bits of it).
    pub count: u64,
    /// For a call that reads and writes the peers' shared buffers, a tag of
    /// their allocations (0: it does not).
    pub shared: u32,
    /// Root (0 for calls without one, and for point-to-point).
    pub root: u32,
    /// Sequence number on the communicator (0 for point-to-point, whose
    /// numbering differs between the two ranks).
    pub seq: u64,
    /// Whether counts vary by rank (`count` is then a hash of every
    /// rank's block, or for all-to-all, per pair of ranks, what one sends
    /// the other: [`pair`](Self::pair)).
    pub varying: bool,
}

/// FNV-1a of a name, folded to 32 bits.
pub const fn name_hash(name: &str) -> u32 {
    fold(fnv(FNV_BASIS, name))
}

/// [`name_hash`] of the parts written one after the other (no string is
/// built: calls hash their type name with a device suffix this way).
pub const fn name_hash_parts(parts: &[&str]) -> u32 {
    let (mut h, mut i) = (FNV_BASIS, 0);
    while i < parts.len() {
        h = fnv(h, parts[i]);
        i += 1;
    }
    fold(h)
}

const FNV_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a state `h` extended by the bytes of `s`.
const fn fnv(mut h: u64, s: &str) -> u64 {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        h ^= b[i] as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    h
}

const fn fold(h: u64) -> u32 {
    (h ^ (h >> 32)) as u32
}

/// The name hashes of element type `T` and operator `O`, computed at
/// compile time (a call's fingerprint needs them every time).
pub struct NameHashes<T, O>(PhantomData<(T, O)>);

impl<T: Reduce, O: ReduceOp<T>> NameHashes<T, O> {
    /// The type's name hash, for host buffers.
    pub const TYPE: u32 = name_hash(T::NAME);
    /// The type's name hash for device buffers: `T::NAME` then `@gpu`, so
    /// a device call never matches a host call.
    pub const TYPE_ON_GPU: u32 = name_hash_parts(&[T::NAME, "@gpu"]);
    /// The operator's name hash, of ccl's own operators.
    const OP_NAME: u32 = name_hash(O::NAME);

    /// The operator's hash: of its name where that tells it apart (ccl's
    /// own, at compile time), else of its name and its type's path.
    #[inline]
    pub fn op() -> u32 {
        if O::NAMED_UNIQUELY {
            Self::OP_NAME
        } else {
            name_hash_parts(&[O::NAME, "@", std::any::type_name::<O>()])
        }
    }
}

const P2P: u8 = 0xff;

/// The bit of a call kind's code that marks counts varying by rank.
const VARYING: u8 = 0x40;

/// The bit of a call kind's code that marks a call a rank was sent by a
/// peer that made it otherwise ([`Fingerprint::disputed`]).
const DISPUTED: u8 = 0x80;

/// Bits of the count a fingerprint carries (more elements than that do not
/// fit any machine's memory); the shared buffers' tag takes the rest.
pub const COUNT_BITS: u32 = 40;

#[inline]
fn coll_code(c: Coll) -> u8 {
    match c {
        Coll::Send | Coll::Recv => P2P,
        other => Coll::ALL.iter().position(|&x| x == other).unwrap_or(0) as u8,
    }
}

impl Fingerprint {
    /// The fingerprint of a call, given its type's and operator's
    /// [`name_hash`] (0: no operator).
    #[inline]
    pub fn new(
        coll: Coll,
        elem_size: usize,
        type_hash: u32,
        op_hash: u32,
        count: usize,
        root: usize,
        seq: u64,
    ) -> Self {
        let p2p = matches!(coll, Coll::Send | Coll::Recv);
        Fingerprint {
            coll,
            elem_size: elem_size as u32,
            type_hash,
            op_hash,
            count: count as u64 & ((1 << COUNT_BITS) - 1),
            shared: 0,
            root: if p2p || !coll.rooted() { 0 } else { root as u32 },
            seq: if p2p { 0 } else { seq },
            varying: false,
        }
    }

    /// This call with counts that vary by rank as `blocks` says: ranks
    /// must agree on every block. An all-to-all's blocks differ by rank
    /// (what each sends and receives): its messages carry, per pair of
    /// ranks, the count one sends the other instead ([`pair`](Self::pair)).
    pub fn varying(self, blocks: &crate::algo::Blocks) -> Self {
        let count = if self.coll == Coll::AllToAll { 0 } else { blocks.hash() & ((1 << COUNT_BITS) - 1) };
        Fingerprint { count, varying: true, ..self }
    }

    /// `theirs`, a peer's call that differs from this rank's of the same
    /// number, marked as such: what a rank failing that call posts in
    /// place of its own, which every rank then finds different from its own.
    pub fn disputed(mut theirs: Words) -> Words {
        theirs[0] |= u64::from(DISPUTED);
        theirs
    }

    /// The words of a message of this call (`words`) that carries `count`
    /// elements of what one rank sends another in a varying all-to-all.
    #[inline]
    pub fn pair(mut words: Words, count: usize) -> Words {
        let mask = (1 << COUNT_BITS) - 1;
        words[1] = (words[1] & !mask) | (count as u64 & mask);
        words
    }

    /// This call on shared buffers of allocations `numbers` (the input's,
    /// none in place, and the output's): ranks that pass buffers of other
    /// allocations, or private memory, disagree with it.
    pub fn on_shared(self, numbers: (Option<u64>, u64)) -> Self {
        let mut h = FNV_BASIS;
        for w in [numbers.0.map_or(0, |n| n + 1), numbers.1] {
            for b in w.to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        let bits = 64 - COUNT_BITS;
        Fingerprint { shared: 1 + (fold(h) % ((1 << bits) - 1)), ..self }
    }

    /// The words to put in a slot.
    #[inline]
    pub fn words(&self) -> Words {
        [
            u64::from(coll_code(self.coll) | if self.varying { VARYING } else { 0 })
                | u64::from(self.elem_size) << 8
                | u64::from(self.root) << 32,
            self.count | u64::from(self.shared) << COUNT_BITS,
            u64::from(self.type_hash) | u64::from(self.op_hash) << 32,
            self.seq,
        ]
    }

    /// The error between calls `ours` and `theirs`, described.
    pub fn mismatch(ours: &Words, theirs: &Words) -> crate::error::ErrorKind {
        let theirs_told = Self::describe(theirs) + Self::hint(ours, theirs);
        crate::error::ErrorKind::Mismatch { ours: Self::describe(ours), theirs: theirs_told }
    }

    /// What to add to an error between calls `ours` and `theirs` that
    /// differ only in their shared buffers: how to mend it.
    fn hint(ours: &Words, theirs: &Words) -> &'static str {
        let count = (1 << COUNT_BITS) - 1;
        let same_but_memory = ours[0] == theirs[0] && ours[2..] == theirs[2..] && ours[1] & count == theirs[1] & count;
        if same_but_memory && ours[1] != theirs[1] {
            " (every rank must pass its own buffer of the same alloc_shared allocation)"
        } else {
            ""
        }
    }

    /// Describes the call that sent `w`, naming its type and operator when
    /// they are among ccl's own.
    pub fn describe(w: &Words) -> String {
        let code = (w[0] & 0xff) as u8;
        let disputed = code != P2P && code & DISPUTED != 0;
        let code = if disputed { code & !DISPUTED } else { code };
        let varying = code != P2P && code & VARYING != 0;
        let code = if varying { code & !VARYING } else { code };
        let coll = if code == P2P {
            "send/recv".to_string()
        } else {
            let name = Coll::ALL.get(code as usize).map_or("?", |c| c.name());
            format!("{name}{}", if varying { "v" } else { "" })
        };
        let size = (w[0] >> 8) & 0xff_ffff;
        let root = w[0] >> 32;
        let (th, oh) = (w[2] as u32, (w[2] >> 32) as u32);
        let ty = KNOWN_TYPES.iter().find(|t| name_hash(t) == th).map_or(format!("type#{th:08x}"), |t| t.to_string());
        let op = match oh {
            0 => String::new(),
            h => format!(
                ", {}",
                KNOWN_OPS.iter().find(|o| name_hash(o) == h).map_or(format!("op#{h:08x}"), |o| o.to_string())
            ),
        };
        let rooted = code != P2P && Coll::ALL.get(code as usize).is_some_and(|c| c.rooted());
        let root = if rooted { format!(", root {root}") } else { String::new() };
        let count = w[1] & ((1 << COUNT_BITS) - 1);
        let count = match (varying, Coll::ALL.get(code as usize)) {
            (true, Some(Coll::AllToAll)) if count == 0 => "counts by pair".to_string(),
            (true, Some(Coll::AllToAll)) => format!("{count} to one peer"),
            (true, _) => format!("counts #{count:010x}"),
            _ => count.to_string(),
        };
        let shared = match w[1] >> COUNT_BITS {
            0 => String::new(),
            tag => format!(" on shared buffers @{tag:06x}"),
        };
        let disputed = if disputed { ", as another rank sent it this call" } else { "" };
        format!("{coll}({count} × {ty} of {size} B{op}{root}){shared} #{}{disputed}", w[3])
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&Fingerprint::describe(&self.words()))
    }
}

const KNOWN_TYPES: [&str; 15] = [
    "i8",
    "i16",
    "i32",
    "i64",
    "u8",
    "u16",
    "u32",
    "u64",
    "isize",
    "usize",
    "f32",
    "f64",
    "f16",
    "bf16",
    CHECK_WORD,
];

/// The element type of the exchange of calls under `CCL_CHECK=full`.
pub(crate) const CHECK_WORD: &str = "call check word";
const KNOWN_OPS: [&str; 8] = ["sum", "prod", "min", "max", "avg", "band", "bor", "bxor"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_show_and_p2p_ignores_numbering() {
        let a = Fingerprint::new(Coll::AllReduce, 4, name_hash("f32"), name_hash("sum"), 1000, 0, 12);
        assert_eq!(a.to_string(), "all_reduce(1000 × f32 of 4 B, sum) #12");
        let b = Fingerprint::new(Coll::AllReduce, 4, name_hash("i32"), name_hash("sum"), 1000, 0, 12);
        assert_ne!(a.words(), b.words());
        let c = Fingerprint::new(Coll::Broadcast, 8, name_hash("f64"), 0, 5, 3, 2);
        assert_eq!(c.to_string(), "broadcast(5 × f64 of 8 B, root 3) #2");
        let s = Fingerprint::new(Coll::Send, 2, name_hash("u16"), 0, 7, 1, 40);
        let r = Fingerprint::new(Coll::Recv, 2, name_hash("u16"), 0, 7, 0, 3);
        assert_eq!(s.words(), r.words());
        assert_eq!(s.to_string(), "send/recv(7 × u16 of 2 B) #0");
        let user = Fingerprint::new(Coll::AllReduce, 24, name_hash("app::Moments"), name_hash("sum"), 1, 0, 0);
        assert!(user.to_string().contains("type#"));
    }

    #[test]
    fn shared_buffers_of_other_allocations_differ() {
        let a = Fingerprint::new(Coll::AllReduce, 4, name_hash("f32"), name_hash("sum"), 1 << 20, 0, 3);
        let tags: Vec<Words> = [(None, 0), (None, 1), (Some(0), 1), (Some(1), 0), (Some(0), 0)]
            .into_iter()
            .map(|n| a.on_shared(n).words())
            .collect();
        for (i, x) in tags.iter().enumerate() {
            assert_ne!(*x, a.words());
            assert!(tags[i + 1..].iter().all(|y| y != x), "{i}");
        }
        let s = a.on_shared((None, 7)).to_string();
        assert!(s.starts_with("all_reduce(1048576 × f32 of 4 B, sum) on shared buffers @") && s.ends_with(" #3"), "{s}");
    }

    #[test]
    fn varying_counts_show_as_their_own_call() {
        use crate::algo::Blocks;
        let b = Blocks::new(Blocks::packed(&[1, 2]), Box::new([]));
        let a = Fingerprint::new(Coll::AllGather, 4, name_hash("f32"), 0, 3, 0, 5);
        let v = a.varying(&b);
        assert_ne!(a.words(), v.words());
        assert!(v.to_string().starts_with("all_gatherv(counts #"), "{v}");
        let c = Blocks::new(Blocks::packed(&[2, 1]), Box::new([]));
        assert_ne!(v.words(), a.varying(&c).words());
        let t = Fingerprint::new(Coll::AllToAll, 4, name_hash("f32"), 0, 0, 0, 5).varying(&b);
        assert_eq!(t.words(), Fingerprint::new(Coll::AllToAll, 4, name_hash("f32"), 0, 0, 0, 5).varying(&c).words());
        let w = Fingerprint::pair(t.words(), 7);
        assert_eq!(Fingerprint::describe(&w), "all_to_allv(7 to one peer × f32 of 4 B) #5");
    }

    #[test]
    fn a_name_in_parts_hashes_as_the_whole_name() {
        assert_eq!(name_hash_parts(&["f32", "@gpu"]), name_hash("f32@gpu"));
        assert_eq!(name_hash_parts(&[]), name_hash(""));
        assert_ne!(name_hash_parts(&["f32", "@gpu"]), name_hash("f32"));
    }
}
